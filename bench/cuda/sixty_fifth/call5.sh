#!/usr/bin/env bash
# Sixty-fifth pass, call 5: the matrix form as committed (the next tile's rows into L2; at fewer
# than 4 query heads a KV head only where the lane form does worse): gpu_generated_flows, which
# gained a case of 2 query heads a KV head; `vortex bench attention` of generated index phases
# against fb33f1a (`vortex_old`) at 2 and 4 query heads a KV head; then, in the time left,
# every GPU suite.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins5_65.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
R=$OUT/r5; mkdir -p $R
save() { echo "$1 rc=$2 $SECONDS s" >> $R/info.txt; tar czf $OUT/call5.tgz -C $OUT r5; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
timeout 100 $B/gpu_generated_flows --nocapture > $R/generated_flows.txt 2>&1
save generated_flows $?
G=/tmp/gen; mkdir -p $G
for f in quest block_topk quest_fp8 block_topk_fp8; do sed "s/^flow $f /flow ${f}_gen /" crates/flow/flows/$f.flow > $G/${f}_gen.flow; done
flows=quest_fp8,block_topk,block_topk_fp8,$G/quest_fp8_gen.flow,$G/block_topk_fp8_gen.flow,$G/block_topk_gen.flow,crates/cuda/tests/flows/sums.flow
for shape in "16:8:128" "32:8:128"; do
  IFS=: read hq hk d <<< "$shape"
  for bin in vortex_old vortex; do
    echo "## $bin $shape" >> $R/index.txt
    timeout 30 $B/$bin bench attention --device cuda --batch 16 --context 32k --budget 2k --iters 20 \
      --launches-per-timing 10 --kv-dtype bf16 --heads-q $hq --heads-kv $hk --head-dim $d \
      --flows $flows >> $R/index.txt 2>&1
    save "$bin $shape" $?
  done
done
left=$((260 - SECONDS))
[ $left -gt 60 ] && { timeout $left bash scripts/gpu_suites.sh run $B $R/all > $R/all.txt 2>&1; save suites $?; rm -rf $R/all; tar czf $OUT/call5.tgz -C $OUT r5; }
cat $R/info.txt $R/all.txt 2>/dev/null | cut -c1-150; grep -E "^test |test result|compared" $R/generated_flows.txt | tail -3 | cut -c1-300
grep -E "^## |(_gen|sums)\.flow .* 8w1bp|^ *(quest_fp8|block_topk|block_topk_fp8) .* 8w1bp" $R/index.txt | cut -c1-110
