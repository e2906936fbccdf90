#!/usr/bin/env bash
# Log-probabilities picked ahead: the suites that run them, then logprobs.py against `vortex serve
# --device cuda --random-weights qwen3-1.7b` on the build before (vortex_old, 3163b09) and this one.
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
for t in gpu_logprobs gpu_sampling gpu_engine gpu_model; do
  timeout 150 ./$t > $R/$t.txt 2>&1; echo "$t rc=$? $(grep -h '^test result' $R/$t.txt | tail -1)" >> $R/tests.txt
done
cat $R/tests.txt
for b in old new; do
  bin=./vortex; [ $b = old ] && bin=./vortex_old
  $bin serve --device cuda --random-weights qwen3-1.7b --port 8011 > $R/serve_$b.log 2>&1 &
  S=$!
  for i in $(seq 60); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 1; done
  timeout 90 python3 logprobs.py http://127.0.0.1:8011 128 > $R/logprobs_$b.txt 2>&1
  kill $S; wait $S
done
cat $R/logprobs_*.txt
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
