#!/usr/bin/env bash
# Sixty-fourth pass, call 3: every GPU suite on 709c56a (the CPU runner, which the GPU suites
# compare with, now folds reductions of pairs with a field in one pass over the stored field).
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins3_64.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
R=$OUT/r3; mkdir -p $R
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
bash scripts/gpu_suites.sh run $B $R/all > $R/all.txt 2>&1; echo "suites rc=$? $SECONDS s" >> $R/info.txt
tar czf $OUT/call3.tgz -C $OUT r3
rm -rf $R/all
cat $R/info.txt $R/all.txt
