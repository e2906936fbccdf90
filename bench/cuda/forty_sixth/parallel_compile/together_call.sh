#!/usr/bin/env bash
# The compile-bound suites from a cold kernel cache, their modules now compiled on every core
# first (before: kernels_compile 425 s, gpu_generated_flows 421 s, gpu_attention 232 s,
# gpu_flow_passes 75-91 s, H100, this session's first call).
set -u
B=/tmp/bins; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache_cold
S=/tmp/suites2; mkdir -p $S
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S/summary.txt
nproc >> $S/summary.txt
suite() { local t0=$SECONDS; timeout 140 $B/$1 > $S/$1.txt 2>&1; echo "$1 rc=$? $((SECONDS-t0))s $(grep -h '^test result' $S/$1.txt | tail -1)" >> $S/summary.txt; }
suite kernels_compile & suite gpu_generated_flows & suite gpu_attention & suite gpu_flow_passes; wait
cp $S/summary.txt $OUT/summary.txt
grep -hE "panicked|FAILED" $S/*.txt | head -20 >> $OUT/summary.txt
tar czf $OUT/logs.tgz -C $S .
