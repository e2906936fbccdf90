#!/usr/bin/env bash
# Fifty-first pass, call 3: dense and sparse attention at 32K, batch 16, Qwen3-8B's geometry, the
# forty-second pass's build (f93630d, vortex_f93) against this stop's (5f691fe, vortex),
# alternated twice; then target (a)'s pair against PyTorch's SDPA on this stop's build.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader; date -u; } > $OUT/info.txt
for round in 1 2; do for v in vortex_f93 vortex; do
  echo "== $v round $round" >> $OUT/ab.txt
  timeout 120 $B/$v bench attention --device cuda --batch 16 --context 32k --budget 2k --flows block_topk,quest_fp8 --iters 30 --launches-per-timing 10 >> $OUT/ab.txt 2>&1
done; done
echo "ab done $SECONDS s" >> $OUT/info.txt
timeout 240 $B/vortex bench attention --device cuda --batch 16 --context 8k,32k,128k --budget 2k --flows block_topk,quest_fp8 --iters 30 --json-out $OUT/vortex.json > $OUT/attention.txt 2>&1
timeout 200 python3 scripts/sdpa_decode_bench.py --iters 50 --block-topk-context 32768 --json $OUT/sdpa.json --vortex $OUT/vortex.json > $OUT/sdpa.txt 2>&1
echo "sdpa done $SECONDS s" >> $OUT/info.txt
