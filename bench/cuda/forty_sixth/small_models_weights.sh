#!/usr/bin/env bash
# Small models' decode steps, bf16 weights (cuBLAS products) against fp8 (the project's small-row kernel).
B=/tmp/vb; mkdir -p $B && tar xJf .gpu/v.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
for g in gemma3-270m qwen3-0.6b gemma3-1b qwen3-1.7b; do for w in bf16 fp8; do
  echo "== $g $w" >> $OUT/weights.txt
  timeout 40 $B/vortex bench decode --device cuda --random-weights $g --weight-dtype $w --batch 16 --context 8k --decode-tokens 32 --flows dense >> $OUT/weights.txt 2>&1
done; done
