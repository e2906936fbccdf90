#!/usr/bin/env bash
# Fifty-ninth pass, call 1: sparse steps with few rows (batch 1 to 16), each index row scored by
# one block (--index-parts 1, the build before) and by the blocks the step plans (a cluster a
# row), alternated twice; then the decode step at batch 1.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $OUT/info.txt
F=block_topk,block_topk_fp8,quest,quest_fp8
for round in 1 2; do
  for P in 1 8; do
    timeout 150 $B/vortex bench attention --device cuda --batch 1,4,16 --context 32k,128k --budget 2k --iters 20 --flows $F --launches-per-timing 10 --index-parts $P --json-out $OUT/parts${P}_r$round.json > $OUT/parts${P}_r$round.txt 2>&1
    echo "round $round parts $P rc=$? $SECONDS s" >> $OUT/info.txt
  done
done
for C in 32k 128k; do
  timeout 120 $B/vortex bench decode --device cuda --random-weights qwen3-8b --batch 1 --context $C --budget 2k --decode-tokens 32 --flows dense,block_topk,quest_fp8 > $OUT/decode_b1_$C.txt 2>&1
  echo "decode $C rc=$? $SECONDS s" >> $OUT/info.txt
done
