#!/usr/bin/env bash
# Sixty-second pass, call 6: gpu_generated_flows with the `thread_cache` test flow, whose cache
# phase is too large for a warp's shared memory from head_dim 128 (the thread form), twice.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins5.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
R=$OUT/r6; mkdir -p $R
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
for run in 1 2; do
  timeout 150 $B/gpu_generated_flows --nocapture > $R/gpu_generated_flows_$run.txt 2>&1
  echo "run $run rc=$? $SECONDS s" >> $R/info.txt
done
tar czf $OUT/call6.tgz -C $OUT r6
cat $R/info.txt; grep -h "thread_cache\|test result" $R/gpu_generated_flows_1.txt | head -12
