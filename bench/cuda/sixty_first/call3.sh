#!/usr/bin/env bash
# Sixty-first pass, call 3: the tensor-core scorers (scores.cu) fetching the summaries of the
# step AHEAD steps on into L2: AHEAD = 1 (as before, `vortex_a1`), 2 (`vortex`, the suites'
# build) and 3 (`vortex_a3`) alternated twice on the flows that use them; then every suite.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache RUST_TEST_NOCAPTURE=1
R=$OUT/r3; mkdir -p $R
save() { tar czf $OUT/call3.tgz -C $OUT r3; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
for run in a1 a2 a3 a1_2 a2_2 a3_2; do
  bin=$B/vortex; case $run in a1*) bin=$B/vortex_a1;; a3*) bin=$B/vortex_a3;; esac
  timeout 45 $bin bench attention --device cuda --batch 4,16 --context 32k --budget 2k --iters 50 --launches-per-timing 10 --flows block_topk,block_topk_fp8,quest_fp8,h2o --json-out $R/$run.json > $R/$run.txt 2>&1
  echo "$run rc=$? $SECONDS s" >> $R/info.txt; save
done
python3 bench/cuda/fifty_ninth/parts_table.py a1=$R/a1.json a2=$R/a2.json a3=$R/a3.json a1_2=$R/a1_2.json a2_2=$R/a2_2.json a3_2=$R/a3_2.json > $R/table.txt 2>&1
save
timeout 200 scripts/gpu_suites.sh run $B $R/suites > /dev/null 2>&1
echo "suites rc=$? $SECONDS s" >> $R/info.txt; save
cat $R/info.txt $R/table.txt $R/suites/summary.txt
