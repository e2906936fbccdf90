#!/usr/bin/env bash
# Sixty-fourth pass, call 4: Qwen3-8B's decode (random bf16 weights, an fp8 KV pool so that
# batch 16 at 32K fits an 80 GB card; four query heads a KV head, where the generated Quest reads
# products by the query's sign) with quest and block_topk hand-written and generated (their
# files under another name), on 709c56a (the GPU kernels of d199898).
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins3_64.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
R=$OUT/r4; mkdir -p $R
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
G=/tmp/gen; mkdir -p $G
for f in quest block_topk; do sed "s/^flow $f /flow ${f}_gen /" crates/flow/flows/$f.flow > $G/${f}_gen.flow; done
timeout 300 $B/vortex bench decode --device cuda --batch 16 --context 32k --decode-tokens 32 --budget 2k \
  --settle-ms 1000 --ahead --random-weights qwen3-8b --kv-dtype fp8 \
  --flows dense,quest,$G/quest_gen.flow,block_topk,$G/block_topk_gen.flow > $R/decode.txt 2>&1
echo "decode rc=$? $SECONDS s" >> $R/info.txt
tar czf $OUT/call4.tgz -C $OUT r4
cat $R/info.txt; cut -c1-200 $R/decode.txt | tail -20
