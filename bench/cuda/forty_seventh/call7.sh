#!/usr/bin/env bash
# Call 7: the 8-warp build's plan floor at one page a warp (not two) where pages go in steps:
# Gemma 3 steps and Gemma-geometry attention, this pass's build and the floor, alternated.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/info.txt
for round in 1 2 3; do for v in vortex vortex_floor; do
  for g in gemma3-270m gemma3-1b; do
    echo "== $round $v $g" >> $OUT/bench.txt
    timeout 60 $B/$v bench decode --device cuda --random-weights $g --batch 16 --context 8k --decode-tokens 32 --flows dense,block_topk >> $OUT/bench.txt 2>&1
  done
done; done
for v in vortex vortex_floor; do
  echo "== $v attention 4 1 256" >> $OUT/att.txt
  timeout 90 $B/$v bench attention --device cuda --heads-q 4 --heads-kv 1 --head-dim 256 --batch 16 --context 512,2k,8k --flows dense --iters 30 >> $OUT/att.txt 2>&1
done
