#!/usr/bin/env bash
# Call 8: Gemma 3 4B's geometry (8 query heads over 4 KV heads of 256), the build before this
# pass and this one, alternated.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/info.txt
for round in 1 2; do for v in vortex_old vortex; do
  echo "== $round $v gemma3-4b" >> $OUT/bench.txt
  timeout 120 $B/$v bench decode --device cuda --random-weights gemma3-4b --batch 16 --context 8k,32k --decode-tokens 32 --flows dense,block_topk >> $OUT/bench.txt 2>&1
done; done
