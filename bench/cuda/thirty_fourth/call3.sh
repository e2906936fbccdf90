#!/usr/bin/env bash
# Every GPU suite on the build with a kernel parameter per flow field, then held_ahead.py with
# 512-token replies against `vortex serve --device cuda --random-weights qwen3-1.7b`, decoding
# ahead and with --no-decode-ahead.
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
timeout 360 ./gpu_suites.sh run . $R/suites
for mode in ahead no_ahead; do
  flag=""; [ $mode = no_ahead ] && flag=--no-decode-ahead
  ./vortex serve --device cuda --random-weights qwen3-1.7b --port 8011 $flag > $R/serve_$mode.log 2>&1 &
  S=$!
  for i in $(seq 60); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 1; done
  timeout 80 python3 held_ahead.py http://127.0.0.1:8011 512 > $R/held_$mode.txt 2>&1
  kill $S; wait $S
done
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
