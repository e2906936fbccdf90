#!/usr/bin/env bash
# gpu_model (which layers keep summaries; h2o and lsh on Gemma 3's layout), gpu_engine,
# gpu_graphs, gpu_h2o and gpu_flow_passes (per-request state only where layers select).
set -u
B=/tmp/bins; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
S=/tmp/suites; mkdir -p $S
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S/summary.txt
suite() { local t0=$SECONDS; timeout 150 $B/$1 --nocapture > $S/$1.txt 2>&1; echo "$1 rc=$? $((SECONDS-t0))s $(grep -h '^test result' $S/$1.txt | tail -1)" >> $S/summary.txt; }
suite gpu_graphs & suite gpu_h2o & suite gpu_flow_passes & suite gpu_model; wait; suite gpu_engine
cp $S/summary.txt $OUT/summary.txt
grep -hE "panicked|FAILED" $S/*.txt | head -20 >> $OUT/summary.txt
tar czf $OUT/logs.tgz -C $S .
