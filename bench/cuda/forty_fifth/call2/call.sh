#!/usr/bin/env bash
# Call 2: the committed build's model, engine and graph suites.
set -u
B=/tmp/bins; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
S=/tmp/suites; mkdir -p $S
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S/summary.txt
suite() { local t0=$SECONDS; timeout 150 $B/$1 --nocapture > $S/$1.txt 2>&1; echo "$1 rc=$? $((SECONDS-t0))s $(grep -h '^test result' $S/$1.txt | tail -1)" >> $S/summary.txt; }
suite gpu_model; suite gpu_engine & suite gpu_graphs; wait
cp $S/summary.txt $OUT/summary.txt
grep -hE "panicked|FAILED" $S/*.txt | head -20 >> $OUT/summary.txt
tar czf $OUT/logs.tgz -C $S .
