#!/usr/bin/env bash
# Fifty-ninth pass, call 2: every GPU suite on the build of call 1.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
scripts/gpu_suites.sh run $B $OUT/suites > /dev/null 2>&1
echo "rc=$?" >> $OUT/suites/summary.txt
cat $OUT/suites/summary.txt
grep -h "blocks a row" $OUT/suites/gpu_block_topk.txt | sort | uniq -c | head -40
