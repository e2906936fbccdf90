#!/usr/bin/env bash
# Fifty-fourth pass, call 3: every GPU suite on the build whose CPU products take calls of
# 8 tokens (f273def): the GPU model and engine suites check the GPU against the CPU's products.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu/rev; } > $OUT/info.txt
timeout 360 bash scripts/gpu_suites.sh run $B/suites /tmp/suites > /dev/null 2>&1
cp /tmp/suites/summary.txt $OUT/summary.txt
tar czf $OUT/suites.tgz -C /tmp suites
echo "suites done $SECONDS s" >> $OUT/info.txt
