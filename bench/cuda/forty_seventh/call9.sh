#!/usr/bin/env bash
# Call 9: gpu_attention with the new cases (pages in steps at head_dim 256, 128 at pages of 32,
# 64 at pages of 64; windows over NaN outside them).
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/info.txt
t0=$SECONDS; timeout 300 $B/gpu_attention --nocapture > $OUT/gpu_attention.txt 2>&1; echo "gpu_attention rc=$? $((SECONDS-t0))s" >> $OUT/info.txt
