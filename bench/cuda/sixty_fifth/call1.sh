#!/usr/bin/env bash
# Sixty-fifth pass, call 1: every target of #5 on the committed build (`fb33f1a`), in one call,
# on an H200 (Qwen3-8B with bf16 weights at batch 16, 32K needs more than an 80 GB card).
# (a) dense against PyTorch's SDPA backends and the copy bandwidth, batch 16 at 8K, 32K, 128K;
# (b) the sparse steps at 32K, one launch a timing and ten back to back, and the naive PyTorch
# block top-k and Quest steps; (c) the top-k's speed test; (d) decode, batch 16 at 32K.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins1_65.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
R=$OUT/r1; mkdir -p $R
save() { echo "$1 rc=$2 $SECONDS s" >> $R/info.txt; tar czf $OUT/call1.tgz -C $OUT r1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
D="$B/vortex bench decode --device cuda --batch 16 --context 32k --decode-tokens 32 --budget 2k --settle-ms 1000 --ahead"
timeout 170 $D --random-weights qwen3-8b --flows dense,block_topk,block_topk_fp8 > $R/decode_8b_bf16.txt 2>&1
save decode_8b_bf16 $?
A="$B/vortex bench attention --device cuda --batch 16 --budget 2k --iters 50"
F=block_topk,block_topk_fp8,quest,quest_fp8
timeout 90 $A --context 8k,32k,128k --flows $F --json-out $R/attention.json > $R/attention.txt 2>&1
save attention $?
timeout 100 python3 scripts/sdpa_decode_bench.py --iters 50 --block-topk-context 32768 --json $R/sdpa.json --vortex $R/attention.json > $R/sdpa.txt 2>&1
save sdpa $?
timeout 60 $A --context 32k --flows $F,h2o --launches-per-timing 10 --json-out $R/back_to_back.json > $R/back_to_back.txt 2>&1
save back_to_back $?
timeout 60 $B/gpu_topk --ignored gpu_topk_speed --nocapture > $R/topk_speed.txt 2>&1
save topk_speed $?
timeout 80 $D --random-weights qwen3-1.7b --flows dense,block_topk > $R/decode_17b.txt 2>&1
save decode_17b $?
cd $R; cat info.txt; for f in decode_8b_bf16 attention sdpa back_to_back topk_speed decode_17b; do echo "== $f"; grep -v "^$" $f.txt | cut -c1-220 | tail -16; done
