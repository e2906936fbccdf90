#!/usr/bin/env bash
# Sixty-ninth pass, call 1, for an H200 (Qwen3-8B with bf16 weights at batch 16, 32K needs
# more than an 80 GB card): every target of #5 on the build of `7edc9bc` (no kernel or engine
# code has changed since): (d) decode first (8B bf16, 8B fp8 weights, 1.7B), (a) dense against
# PyTorch's SDPA backends, (b) the sparse steps and the naive PyTorch ones, (c) the top-k's speed
# test; then every GPU suite in the time left.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins_67.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
R=$OUT/r1; mkdir -p $R
save() { echo "$1 rc=$2 $SECONDS s" >> $R/info.txt; tar czf $OUT/call1.tgz -C $OUT r1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
D="$B/vortex bench decode --device cuda --batch 16 --context 32k --decode-tokens 32 --budget 2k --settle-ms 1000 --ahead"
timeout 150 $D --random-weights qwen3-8b --flows dense,block_topk,block_topk_fp8 > $R/decode_8b_bf16.txt 2>&1
save decode_8b_bf16 $?
timeout 100 $D --random-weights qwen3-8b --weight-dtype fp8 --flows dense,block_topk,block_topk_fp8 > $R/decode_8b_fp8.txt 2>&1
save decode_8b_fp8 $?
timeout 60 $D --random-weights qwen3-1.7b --flows dense,block_topk > $R/decode_17b.txt 2>&1
save decode_17b $?
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
left=$((585 - SECONDS))
[ $left -gt 60 ] && { timeout $left scripts/gpu_suites.sh run $B $R/suites > $R/suites.txt 2>&1; save suites $?; }
cd $R; cat info.txt
for f in decode_8b_bf16 decode_8b_fp8 decode_17b; do echo "== $f"; grep -v "^$" $f.txt | cut -c1-160 | tail -9; done
grep default attention.txt | cut -c1-170; grep -E "x$|naive" sdpa.txt | cut -c1-120
grep default back_to_back.txt | cut -c1-170; grep -E "^ +[0-9]+ +[0-9]+ " topk_speed.txt
cat suites/summary.txt 2>/dev/null
