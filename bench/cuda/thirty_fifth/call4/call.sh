#!/usr/bin/env bash
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
timeout 120 ./gpu_engine zz_debug --nocapture > $R/debug.txt 2>&1
grep -v "^gpu \|^cpu " $R/debug.txt | tail -30
./vortex serve --device cuda --random-weights qwen3-1.7b --flows quest,h2o --port 8011 > $R/serve.log 2>&1 &
S=$!
for i in $(seq 90); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 1; done
timeout 300 python3 mixed_flows.py http://127.0.0.1:8011 8192 128 > $R/mixed_flows.txt 2>&1
curl -s http://127.0.0.1:8011/metrics | grep -E "flow_requests|kv_pages" > $R/metrics.txt
kill $S; wait $S
cat $R/mixed_flows.txt $R/metrics.txt; head -3 $R/serve.log; tail -3 $R/serve.log
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
