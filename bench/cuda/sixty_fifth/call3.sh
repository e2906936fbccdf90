#!/usr/bin/env bash
# Sixty-fifth pass, call 3 (calls 1 and 2 found no machine; this one does the work of both that
# fits one call): the matrix form of generated index phases (sums of products by the query on
# the tensor cores). gpu_generated_flows on the working tree (every built-in's generated
# kernels and the test flows against the CPU runner at four geometries); `vortex bench
# attention` of generated index phases, the working tree (`vortex`) against fb33f1a
# (`vortex_old`), alternated, at 4, 8 and 2 query heads a KV head, the hand-written kernels
# beside them; on an H200, Qwen3-8B's decode with bf16 weights (target (d)); then, in the time
# left, every GPU suite.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins2_65.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
R=$OUT/r3; mkdir -p $R
save() { echo "$1 rc=$2 $SECONDS s" >> $R/info.txt; tar czf $OUT/call3.tgz -C $OUT r3; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
timeout 150 $B/gpu_generated_flows --nocapture > $R/generated_flows.txt 2>&1
save generated_flows $?
G=/tmp/gen; mkdir -p $G
for f in quest block_topk quest_fp8 block_topk_fp8; do sed "s/^flow $f /flow ${f}_gen /" crates/flow/flows/$f.flow > $G/${f}_gen.flow; done
flows=quest_fp8,block_topk_fp8,$G/quest_fp8_gen.flow,$G/block_topk_fp8_gen.flow,$G/block_topk_gen.flow,$G/quest_gen.flow,crates/cuda/tests/flows/sums.flow
for run in "32:8:128 1" "64:8:128 1" "32:8:128 2" "16:8:128 1"; do
  read shape n <<< "$run"; IFS=: read hq hk d <<< "$shape"
  for bin in vortex_old vortex; do
    echo "## $bin $shape run $n" >> $R/index.txt
    timeout 60 $B/$bin bench attention --device cuda --batch 16 --context 32k --budget 2k --iters 20 \
      --launches-per-timing 10 --kv-dtype bf16 --heads-q $hq --heads-kv $hk --head-dim $d \
      --flows $flows >> $R/index.txt 2>&1
    save "$bin $shape $n" $?
  done
done
if grep -q H200 $R/info.txt; then
  timeout 170 $B/vortex bench decode --device cuda --batch 16 --context 32k --decode-tokens 32 --budget 2k \
    --settle-ms 1000 --ahead --random-weights qwen3-8b --flows dense,block_topk > $R/decode_8b_bf16.txt 2>&1
  save decode_8b_bf16 $?
fi
left=$((570 - SECONDS))
if [ $left -gt 150 ]; then
  timeout $left bash scripts/gpu_suites.sh run $B $R/all > $R/all.txt 2>&1; save suites $?
  rm -rf $R/all; tar czf $OUT/call3.tgz -C $OUT r3
fi
cat $R/info.txt $R/all.txt 2>/dev/null; grep -E "^test |test result|compared" $R/generated_flows.txt | tail -5
grep -E "^## |(_gen|sums)\.flow .* 8w1bp|^ *(quest_fp8|block_topk_fp8) .* 8w1bp" $R/index.txt | cut -c1-170
tail -8 $R/decode_8b_bf16.txt 2>/dev/null | cut -c1-200
