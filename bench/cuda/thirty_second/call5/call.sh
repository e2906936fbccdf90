#!/usr/bin/env bash
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
for t in gpu_sampling gpu_prefill gpu_graphs; do timeout 120 ./$t > $R/$t.txt 2>&1; echo "$t rc=$? $(grep -h '^test result' $R/$t.txt | tail -1)" >> $R/summary.txt; done
for t in gpu_model gpu_engine; do timeout 120 ./$t > $R/$t.txt 2>&1; echo "$t rc=$? $(grep -h '^test result' $R/$t.txt | tail -1)" >> $R/summary.txt; done
./vortex serve --device cuda --random-weights qwen3-1.7b --port 8011 > $R/serve.log 2>&1 &
S=$!
for i in $(seq 120); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 1; done
timeout 150 python3 serve_check.py http://127.0.0.1:8011 > $R/serve_check.txt 2>&1
kill $S; wait $S
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
