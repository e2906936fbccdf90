#!/usr/bin/env bash
# Sixty-second pass, call 4: every GPU suite on the committed build (`5229aa0`).
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
R=$OUT/r4; mkdir -p $R
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
start=$SECONDS
timeout 400 bash scripts/gpu_suites.sh run $B $R/suites > /dev/null 2>&1
echo "suites rc=$? $((SECONDS - start)) s" >> $R/info.txt
cat $R/info.txt $R/suites/summary.txt
