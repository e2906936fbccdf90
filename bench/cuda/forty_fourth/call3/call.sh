#!/usr/bin/env bash
# The final build's model, engine and graph suites.
set -u
B=/tmp/bins; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
S=/tmp/suites; mkdir -p $S
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S/summary.txt
suite() { local t0=$SECONDS; timeout 200 $B/$1 > $S/$1.txt 2>&1; echo "$1 rc=$? $((SECONDS-t0))s $(grep -h '^test result' $S/$1.txt | tail -1)" >> $S/summary.txt; }
suite gpu_graphs & suite gpu_model; wait; suite gpu_engine
cp $S/summary.txt $OUT/summary.txt
grep -hE "panicked|FAILED" $S/*.txt | head -20 >> $OUT/summary.txt
