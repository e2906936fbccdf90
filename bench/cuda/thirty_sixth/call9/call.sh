#!/usr/bin/env bash
# A step's other flows' index kernels launched as dependents of the one before (beside it):
# the suites that run index launches, then mixed_ab.py with 512 new tokens against the build
# before (vortex_old, d4ef7b0), alternated twice.
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
( timeout 200 ./gpu_flow_passes > $R/gpu_flow_passes.txt 2>&1; echo "gpu_flow_passes rc=$? $(grep -h '^test result' $R/gpu_flow_passes.txt | tail -1)" >> $R/tests.txt ) &
for t in gpu_model gpu_engine gpu_graphs gpu_block_topk gpu_h2o; do
  timeout 150 ./$t > $R/$t.txt 2>&1; echo "$t rc=$? $(grep -h '^test result' $R/$t.txt | tail -1)" >> $R/tests.txt
done
wait
cat $R/tests.txt
for b in old new old new; do
  bin=./vortex; [ $b = old ] && bin=./vortex_old
  $bin serve --device cuda --random-weights qwen3-1.7b --flow block_topk --flows quest,h2o --port 8011 > $R/serve_$b.log 2>&1 &
  S=$!
  for i in $(seq 90); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 1; done
  echo $b >> $R/mixed.txt
  timeout 120 python3 mixed_ab.py http://127.0.0.1:8011 8192 512 mixed >> $R/mixed.txt 2>&1
  kill $S; wait $S
done
cat $R/mixed.txt
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
