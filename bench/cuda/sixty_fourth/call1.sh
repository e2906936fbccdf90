#!/usr/bin/env bash
# Sixty-fourth pass, call 1: Qwen3-1.7B's decode (random weights, batch 16, 32K) with the
# built-in quest and block_topk (hand-written index kernels) and their files under another name
# (generated kernels, the lane form), on 58b35f9 (the sixty-third pass's last commit).
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins1_64.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
R=$OUT/r1; mkdir -p $R
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
G=/tmp/gen; mkdir -p $G
for f in quest block_topk; do sed "s/^flow $f /flow ${f}_gen /" crates/flow/flows/$f.flow > $G/${f}_gen.flow; done
timeout 240 $B/vortex bench decode --device cuda --batch 16 --context 32k --decode-tokens 32 --budget 2k \
  --settle-ms 1000 --ahead --random-weights qwen3-1.7b \
  --flows dense,quest,$G/quest_gen.flow,block_topk,$G/block_topk_gen.flow > $R/decode.txt 2>&1
echo "decode rc=$? $SECONDS s" >> $R/info.txt
tar czf $OUT/call1.tgz -C $OUT r1
cat $R/info.txt; cut -c1-200 $R/decode.txt | tail -20
