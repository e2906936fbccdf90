#!/usr/bin/env bash
# The recall's top k found bit by bit of the k-th largest mass: gpu_page_mass (and its speed),
# gpu_engine, gpu_graphs, gpu_model; the measuring kernels of one 8K and one 32K layer under
# Nsight Compute; then a block_topk
# server (quest and h2o beside) without --recall-every, with 16 and with 1: mixed_ab.py
# against each, its /metrics after.
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
timeout 200 ./gpu_page_mass --include-ignored --nocapture > $R/gpu_page_mass.txt 2>&1
echo "gpu_page_mass rc=$? $(grep -h '^test result' $R/gpu_page_mass.txt | tail -1)" >> $R/tests.txt
for t in gpu_engine gpu_graphs gpu_model; do
  timeout 150 ./$t > $R/$t.txt 2>&1; echo "$t rc=$? $(grep -h '^test result' $R/$t.txt | tail -1)" >> $R/tests.txt
done
grep -E "^copy|^context" $R/gpu_page_mass.txt
cat $R/tests.txt
timeout 120 ncu --kernel-name regex:page_mass --launch-skip 66 --launch-count 6 --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size ./gpu_page_mass --ignored page_mass_speed --nocapture > $R/ncu.csv 2> $R/ncu_err.txt
grep -E "gpu__time_duration" $R/ncu.csv | cut -d, -f5,16-
for every in none 16 1; do
  flag=""; [ $every != none ] && flag="--recall-every $every"
  ./vortex serve --device cuda --random-weights qwen3-1.7b --flow block_topk --flows quest,h2o $flag --port 8011 > $R/serve_$every.log 2>&1 &
  S=$!
  for i in $(seq 90); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 1; done
  echo "recall-every $every" >> $R/mixed.txt
  timeout 150 python3 mixed_ab.py http://127.0.0.1:8011 8192 512 mixed >> $R/mixed.txt 2>&1
  curl -s http://127.0.0.1:8011/metrics | grep -E "^vortex_selection|^vortex_generation_tokens" >> $R/mixed.txt
  kill $S; wait $S
done
cat $R/mixed.txt
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
