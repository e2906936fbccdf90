#!/usr/bin/env bash
# Call 1: the new Gemma row test; gpu_model's sparse comparisons over several seeds with the CPU
# rounding its product inputs to bf16 (as now) and with f32 inputs (as before); the engine suite.
set -u
B=/tmp/bins; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
S=/tmp/suites; mkdir -p $S
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S/summary.txt
suite() { local t0=$SECONDS; timeout 200 $B/$1 "${@:2}" > $S/$1.txt 2>&1; echo "$1 rc=$? $((SECONDS-t0))s $(grep -h '^test result' $S/$1.txt | tail -1)" >> $S/summary.txt; }
suite gpu_layer_kernels & suite gpu_engine & wait
t0=$SECONDS; timeout 120 $B/gpu_model gemma3 --nocapture > $S/model_gemma3.txt 2>&1; echo "model gemma3 rc=$? $((SECONDS-t0))s $(grep -h '^test result' $S/model_gemma3.txt | tail -1)" >> $S/summary.txt
T0=$SECONDS
for seed in 101 102 103 104 105 106 107 108 109 110; do
  [ $((SECONDS - T0)) -gt 110 ] && break
  for mode in bf16 f32; do
    f=$S/model_${mode}_$seed.txt
    if [ $mode = f32 ]; then export VORTEX_TEST_F32_INPUTS=1; else unset VORTEX_TEST_F32_INPUTS; fi
    t0=$SECONDS
    VORTEX_TEST_SEED=$seed timeout 120 $B/gpu_model matches_the_cpu --nocapture > $f 2>&1
    echo "model $mode seed $seed rc=$? $((SECONDS-t0))s $(grep -h '^test result' $f | tail -1)" >> $S/summary.txt
  done
done
unset VORTEX_TEST_F32_INPUTS
cp $S/summary.txt $OUT/summary.txt
grep -hE "panicked|FAILED" $S/gpu_*.txt | head -20 >> $OUT/summary.txt
tar czf $OUT/logs.tgz -C $S .
