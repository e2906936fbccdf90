#!/usr/bin/env bash
# Sixty-fifth pass, call 4: the matrix form with the next tile's rows fetched into L2 while a
# tile loads (`vortex`, the working tree) against call 3's matrix form (`vortex_m1`) and
# fb33f1a (`vortex_old`, the lane form): gpu_generated_flows on the working tree, then `vortex
# bench attention` of generated index phases at 2, 4 and 8 query heads a KV head, the three
# builds in turn, the hand-written kernels beside them.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins4_65.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
R=$OUT/r4; mkdir -p $R
save() { echo "$1 rc=$2 $SECONDS s" >> $R/info.txt; tar czf $OUT/call4.tgz -C $OUT r4; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
timeout 150 $B/gpu_generated_flows --nocapture > $R/generated_flows.txt 2>&1
save generated_flows $?
G=/tmp/gen; mkdir -p $G
for f in quest block_topk quest_fp8 block_topk_fp8; do sed "s/^flow $f /flow ${f}_gen /" crates/flow/flows/$f.flow > $G/${f}_gen.flow; done
flows=quest_fp8,block_topk,block_topk_fp8,$G/quest_fp8_gen.flow,$G/block_topk_fp8_gen.flow,$G/block_topk_gen.flow,crates/cuda/tests/flows/sums.flow
for shape in "32:8:128" "64:8:128" "16:8:128"; do
  IFS=: read hq hk d <<< "$shape"
  for bin in vortex_old vortex_m1 vortex; do
    echo "## $bin $shape" >> $R/index.txt
    timeout 60 $B/$bin bench attention --device cuda --batch 16 --context 32k --budget 2k --iters 20 \
      --launches-per-timing 10 --kv-dtype bf16 --heads-q $hq --heads-kv $hk --head-dim $d \
      --flows $flows >> $R/index.txt 2>&1
    save "$bin $shape" $?
  done
done
cat $R/info.txt; grep -E "^test |test result|compared" $R/generated_flows.txt | tail -3
grep -E "^## |(_gen|sums)\.flow .* 8w1bp|^ *(quest_fp8|block_topk|block_topk_fp8) .* 8w1bp" $R/index.txt | cut -c1-120
