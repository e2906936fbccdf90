#!/usr/bin/env bash
# The suites that build models, on the build whose cuBLAS handles are reused.
cd "$(dirname "$0")" && tar xJf bins.tar.xz
R=$OUT
export VORTEX_KERNEL_CACHE=$PWD/kcache
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
for t in gpu_graphs gpu_fp8_weights gpu_engine gpu_model; do
  s=$SECONDS
  timeout 70 ./$t > $R/$t.txt 2>&1
  echo "$t rc=$? $((SECONDS-s))s $(grep -h '^test result' $R/$t.txt | tail -1)" >> $R/tests.txt
done
cat $R/tests.txt

