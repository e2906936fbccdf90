#!/usr/bin/env bash
# Sixty-seventh pass, call 2, for an H100 (call 1 found no H200): its first part alone,
# `gpu_generated_flows` on the working tree (the matrix form's query sets give way to a step's
# fields, which changes kernels at head_dim 256) and generated index phases at head_dim 256
# against `d86b333` (`vortex_old`).
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins_67.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
R=$OUT/r2; mkdir -p $R
save() { echo "$1 rc=$2 $SECONDS s" >> $R/info.txt; tar czf $OUT/call2.tgz -C $OUT r2; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
timeout 120 $B/gpu_generated_flows --nocapture > $R/generated_flows.txt 2>&1
save generated_flows $?
G=/tmp/gen; mkdir -p $G
for f in quest_fp8 block_topk_fp8; do sed "s/^flow $f /flow ${f}_gen /" crates/flow/flows/$f.flow > $G/${f}_gen.flow; done
flows=quest_fp8,$G/quest_fp8_gen.flow,$G/block_topk_fp8_gen.flow,crates/cuda/tests/flows/sums.flow
for hq in 32 16; do
  for bin in vortex_old vortex; do
    echo "## $bin $hq:8:256" >> $R/index.txt
    timeout 60 $B/$bin bench attention --device cuda --batch 16 --context 32k --budget 2k --iters 20 \
      --launches-per-timing 10 --kv-dtype bf16 --heads-q $hq --heads-kv 8 --head-dim 256 \
      --flows $flows >> $R/index.txt 2>&1
    save "$bin $hq:8:256" $?
  done
done
cd $R; cat info.txt; grep -E "^test result|FAILED|panicked" generated_flows.txt | head -5
grep -E "^## |(_gen|sums)\.flow .* 8w1bp|^ *quest_fp8 .* 8w1bp" index.txt | cut -c1-120
