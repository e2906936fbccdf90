#!/usr/bin/env bash
# Call 1: every GPU suite of this build, and the first part of Gemma 3 270M's weights kept in /tmp/g.
set -u
mkdir -p /tmp/g && cp .gpu/part /tmp/g/part0
B=/tmp/bins; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
timeout 560 scripts/gpu_suites.sh run $B /tmp/suites > /dev/null 2>&1; echo "suites rc=$?" >> /tmp/suites/summary.txt
cp /tmp/suites/summary.txt $OUT/summary.txt
grep -hE "panicked|FAILED" /tmp/suites/*.txt | head -20 >> $OUT/summary.txt
tar czf $OUT/logs.tgz -C /tmp/suites .
ls -la /tmp/g >> $OUT/summary.txt
