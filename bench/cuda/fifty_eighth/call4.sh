#!/usr/bin/env bash
# Fifty-eighth pass, call 4 (an H200 asked for): target (b) on the build of call 3, two rounds,
# with the naive PyTorch steps and SDPA timed in the same call.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $OUT/info.txt
for r in 1 2; do
  timeout 120 $B/vortex bench attention --device cuda --batch 16 --budget 2k --iters 50 --context 32k --flows block_topk,block_topk_fp8,quest,quest_fp8 --launches-per-timing 10 --json-out $OUT/vortex$r.json > $OUT/targets$r.txt 2>&1
  timeout 120 python3 scripts/sdpa_decode_bench.py --iters 50 --contexts 32768 --block-topk-context 32768 --json $OUT/sdpa$r.json --vortex $OUT/vortex$r.json > $OUT/sdpa$r.txt 2>&1
  echo "round $r done $SECONDS s" >> $OUT/info.txt
done
