#!/usr/bin/env bash
# Gemma 3's norm after a sublayer fused with the next sublayer's norm: the suites that run it,
# then decode steps of the build before (vortex_old) and after (vortex), alternated.
set -u
B=/tmp/bins; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
S=/tmp/suites; mkdir -p $S
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S/summary.txt
suite() { local t0=$SECONDS; timeout 240 $B/$1 > $S/$1.txt 2>&1; echo "$1 rc=$? $((SECONDS-t0))s $(grep -h '^test result' $S/$1.txt | tail -1)" >> $S/summary.txt; }
suite gpu_layer_kernels & suite gpu_graphs & suite gpu_fp8_weights & suite gpu_model; wait
suite gpu_engine
cp $S/summary.txt $OUT/summary.txt
grep -hE "panicked|FAILED" $S/*.txt | head -20 >> $OUT/summary.txt
tar czf $OUT/logs.tgz -C $S .
for round in 1 2; do
  for bin in vortex_old vortex; do
    for g in gemma3-270m gemma3-1b; do
      echo "== round $round $bin $g" >> $OUT/bench.txt
      timeout 100 $B/$bin bench decode --device cuda --random-weights $g --batch 16 --context 8k --decode-tokens 32 --flows dense,block_topk >> $OUT/bench.txt 2>&1
    done
  done
done
