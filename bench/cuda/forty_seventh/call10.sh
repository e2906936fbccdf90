#!/usr/bin/env bash
# Call 10: Qwen2.5-Coder-0.5B's attention geometry (14 query heads over 2 KV heads of 64: 7 a
# group, whose chunked build spills), every build.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/info.txt
timeout 150 $B/vortex bench attention --device cuda --heads-q 14 --heads-kv 2 --head-dim 64 --batch 16 --context 2k,8k,32k --flows dense --iters 30 > $OUT/att.txt 2>&1
echo "rc=$?" >> $OUT/info.txt
