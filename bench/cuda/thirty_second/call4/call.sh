#!/usr/bin/env bash
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
timeout 360 ./gpu_suites.sh run . $R/suites
./vortex serve --device cuda --random-weights qwen3-1.7b --port 8011 > $R/serve.log 2>&1 &
S=$!
for i in $(seq 120); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 1; done
timeout 150 python3 serve_check.py http://127.0.0.1:8011 > $R/serve_check.txt 2>&1
kill $S; wait $S
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
