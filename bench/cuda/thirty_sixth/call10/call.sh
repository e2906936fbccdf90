#!/usr/bin/env bash
# After review: gpu_engine and gpu_model's test of several flows in one step, as built and with
# VORTEX_WAIT_WHOLE_INDEX=1 (no index launch beside another).
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
for w in 0 1; do
  VORTEX_WAIT_WHOLE_INDEX=$w timeout 150 ./gpu_engine > $R/gpu_engine_$w.txt 2>&1; echo "gpu_engine wait_whole=$w rc=$? $(grep -h '^test result' $R/gpu_engine_$w.txt | tail -1)" >> $R/tests.txt
  VORTEX_WAIT_WHOLE_INDEX=$w timeout 150 ./gpu_model several_flows > $R/gpu_model_$w.txt 2>&1; echo "gpu_model several_flows wait_whole=$w rc=$? $(grep -h '^test result' $R/gpu_model_$w.txt | tail -1)" >> $R/tests.txt
done
cat $R/tests.txt
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
