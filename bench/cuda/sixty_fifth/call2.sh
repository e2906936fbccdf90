#!/usr/bin/env bash
# Sixty-fifth pass, call 2: the matrix form of generated index phases (sums of products by the
# query on the tensor cores). gpu_generated_flows on the working tree first (every built-in's
# generated kernels and the test flows against the CPU runner at four geometries); then
# `vortex bench attention` of generated index phases, the working tree (`vortex`) against
# fb33f1a (`vortex_old`), alternated twice at three shapes (2, 4 and 8 query heads a KV head),
# the hand-written kernels beside them; then every GPU suite on the working tree.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins2_65.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
R=$OUT/r2; mkdir -p $R
save() { echo "$1 rc=$2 $SECONDS s" >> $R/info.txt; tar czf $OUT/call2.tgz -C $OUT r2; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
timeout 150 $B/gpu_generated_flows --nocapture > $R/generated_flows.txt 2>&1
save generated_flows $?
G=/tmp/gen; mkdir -p $G
for f in quest block_topk quest_fp8 block_topk_fp8; do sed "s/^flow $f /flow ${f}_gen /" crates/flow/flows/$f.flow > $G/${f}_gen.flow; done
flows=quest_fp8,block_topk_fp8,$G/quest_fp8_gen.flow,$G/block_topk_fp8_gen.flow,$G/block_topk_gen.flow,$G/quest_gen.flow
for shape in "32:8:128" "64:8:128" "16:8:128"; do
  IFS=: read hq hk d <<< "$shape"
  for run in 1 2; do
    for bin in vortex_old vortex; do
      echo "## $bin $shape run $run" >> $R/index.txt
      timeout 60 $B/$bin bench attention --device cuda --batch 16 --context 32k --budget 2k --iters 20 \
        --launches-per-timing 10 --kv-dtype bf16 --heads-q $hq --heads-kv $hk --head-dim $d \
        --flows $flows,crates/cuda/tests/flows/sums.flow >> $R/index.txt 2>&1
      save "$bin $shape $run" $?
    done
  done
done
bash scripts/gpu_suites.sh run $B $R/all > $R/all.txt 2>&1; save suites $?
rm -rf $R/all
tar czf $OUT/call2.tgz -C $OUT r2
cat $R/info.txt $R/all.txt; grep -E "^test |test result|compared" $R/generated_flows.txt | tail -5
grep -E "^## |(_gen|sums)\.flow .* 8w1bp|^ *(quest_fp8|block_topk_fp8) .* 8w1bp" $R/index.txt | cut -c1-170
