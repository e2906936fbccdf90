#!/usr/bin/env bash
# Sixty-sixth pass, call 1, on the committed build (`8cee398`): gpu_generated_flows first (its
# case of two query heads a KV head had not run on a GPU), then every target of #5 in one call:
# (a) dense against PyTorch's SDPA backends and the copy bandwidth, batch 16 at 8K, 32K, 128K;
# (b) the sparse steps at 32K, one launch a timing and ten back to back, and the naive PyTorch
# block top-k and Quest steps; (c) the top-k's speed test; (d) decode, batch 16 at 32K; then
# every GPU suite in the time left.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins1_66.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
R=$OUT/r1; mkdir -p $R
save() { echo "$1 rc=$2 $SECONDS s" >> $R/info.txt; tar czf $OUT/call1.tgz -C $OUT r1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
timeout 90 $B/gpu_generated_flows > $R/generated_flows.txt 2>&1
save generated_flows $?
D="$B/vortex bench decode --device cuda --batch 16 --context 32k --decode-tokens 32 --budget 2k --settle-ms 1000 --ahead"
timeout 150 $D --random-weights qwen3-8b --flows dense,block_topk,block_topk_fp8 > $R/decode_8b_bf16.txt 2>&1
save decode_8b_bf16 $?
A="$B/vortex bench attention --device cuda --batch 16 --budget 2k --iters 50"
F=block_topk,block_topk_fp8,quest,quest_fp8
timeout 90 $A --context 8k,32k,128k --flows $F --json-out $R/attention.json > $R/attention.txt 2>&1
save attention $?
timeout 100 python3 scripts/sdpa_decode_bench.py --iters 50 --block-topk-context 32768 --json $R/sdpa.json --vortex $R/attention.json > $R/sdpa.txt 2>&1
save sdpa $?
timeout 60 $A --context 32k --flows $F,h2o --launches-per-timing 10 --json-out $R/back_to_back.json > $R/back_to_back.txt 2>&1
save back_to_back $?
timeout 90 $B/gpu_topk --ignored gpu_topk_speed --nocapture > $R/topk_speed.txt 2>&1
save topk_speed $?
timeout 100 $D --random-weights qwen3-1.7b --flows dense,block_topk > $R/decode_17b.txt 2>&1
save decode_17b $?
timeout 120 $D --random-weights qwen3-8b --weight-dtype fp8 --flows dense,block_topk,block_topk_fp8 > $R/decode_8b_fp8.txt 2>&1
save decode_8b_fp8 $?
left=$((585 - SECONDS))
[ $left -gt 60 ] && { timeout $left scripts/gpu_suites.sh run $B $R/suites > $R/suites.txt 2>&1; save suites $?; }
cd $R; cat info.txt; grep -E "^test result|FAILED|panicked" generated_flows.txt | head -5
for f in decode_8b_bf16 attention sdpa back_to_back topk_speed decode_17b decode_8b_fp8; do echo "== $f"; grep -v "^$" $f.txt | cut -c1-200 | tail -14; done
cat suites/summary.txt 2>/dev/null
