#!/usr/bin/env bash
# Sixty-third pass, call 3: the staged generated index phases of call 2's working tree at 1, 2
# and 4 blocks a row (--index-parts; more warps a multiprocessor at batch 16), Qwen3-8B's shape.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins2.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
R=$OUT/r3; mkdir -p $R
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
F=crates/cuda/tests/flows G=/tmp/gen; mkdir -p $G
for f in quest double_sparse; do sed "s/^flow $f /flow ${f}_gen /" crates/flow/flows/$f.flow > $G/${f}_gen.flow; done
flows=$G/double_sparse_gen.flow,$G/quest_gen.flow,$F/reductions.flow,$F/wide.flow,$F/halves_fp8.flow
for run in 1 2; do
  for parts in 1 2 4; do
    echo "## parts $parts run $run" >> $R/index.txt
    timeout 100 $B/vortex bench attention --device cuda --batch 16 --context 32k --budget 2k --iters 20 \
      --launches-per-timing 10 --kv-dtype bf16 --heads-q 32 --heads-kv 8 --head-dim 128 \
      --index-parts $parts --flows $flows >> $R/index.txt 2>&1
    echo "parts $parts $run rc=$? $SECONDS s" >> $R/info.txt
  done
done
tar czf $OUT/call3.tgz -C $OUT r3
cat $R/info.txt
