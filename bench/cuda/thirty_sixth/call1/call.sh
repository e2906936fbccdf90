#!/usr/bin/env bash
# Requests with their own dense layers and tolerance on a GPU (selection.rs): every GPU suite,
# then own_settings.py against one server.
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
timeout 400 ./gpu_suites.sh run . $R/suites
./vortex serve --device cuda --random-weights qwen3-1.7b --flow block_topk --port 8011 > $R/serve.log 2>&1 &
S=$!
for i in $(seq 90); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 1; done
timeout 150 python3 own_settings.py http://127.0.0.1:8011 8192 128 > $R/own_settings.txt 2>&1
kill $S; wait $S
cat $R/suites/summary.txt $R/own_settings.txt
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
