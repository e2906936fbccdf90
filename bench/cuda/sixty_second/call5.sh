#!/usr/bin/env bash
# Sixty-second pass, call 5 (asks for an H200: Qwen3-8B's decode at batch 16, 32K needs 87-95 GB):
# the targets of #5 on the committed build (`5229aa0`), Qwen3-8B's decode first (d); then (a)
# dense against PyTorch's SDPA backends and the copy bandwidth, batch 16 at 8K, 32K, 128K; (b) the
# sparse steps at 32K, one launch a timing and ten back to back, and the naive PyTorch block
# top-k and Quest steps; Qwen3-1.7B's decode last. Call 4 ran the suites.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
R=$OUT/r5; mkdir -p $R
save() { echo "$1 rc=$2 $SECONDS s" >> $R/info.txt; tar czf $OUT/call5.tgz -C $OUT r5; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
D="$B/vortex bench decode --device cuda --batch 16 --context 32k --decode-tokens 32 --budget 2k --settle-ms 1000 --ahead"
timeout 150 $D --random-weights qwen3-8b --weight-dtype fp8 --flows dense,block_topk,block_topk_fp8 > $R/decode_8b_fp8.txt 2>&1
save decode_8b_fp8 $?
timeout 120 $D --random-weights qwen3-8b --flows dense,block_topk > $R/decode_8b_bf16.txt 2>&1
save decode_8b_bf16 $?
A="$B/vortex bench attention --device cuda --batch 16 --budget 2k --iters 50"
F=block_topk,block_topk_fp8,quest,quest_fp8
timeout 120 $A --context 8k,32k,128k --flows $F --json-out $R/attention.json > $R/attention.txt 2>&1
save attention $?
timeout 150 python3 scripts/sdpa_decode_bench.py --iters 50 --block-topk-context 32768 --json $R/sdpa.json --vortex $R/attention.json > $R/sdpa.txt 2>&1
save sdpa $?
timeout 60 $A --context 32k --flows $F,h2o --launches-per-timing 10 --json-out $R/back_to_back.json > $R/back_to_back.txt 2>&1
save back_to_back $?
timeout 100 $D --random-weights qwen3-1.7b --flows dense,block_topk > $R/decode_17b.txt 2>&1
save decode_17b $?
cd $R; cat info.txt; for f in decode_8b_fp8 decode_8b_bf16 attention sdpa back_to_back decode_17b; do echo "== $f"; grep -v "^$" $f.txt | tail -22; done
