#!/usr/bin/env bash
# gpu_page_mass with two more tensor-core cases (8 query heads per KV head; 1), run twice.
cd "$(dirname "$0")" && tar xJf bins.tar.xz
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
for i in 1 2; do
  timeout 100 ./gpu_page_mass --include-ignored --nocapture > $R/gpu_page_mass_$i.txt 2>&1
  echo "gpu_page_mass run $i rc=$? $(grep -h '^test result' $R/gpu_page_mass_$i.txt | tail -1)" >> $R/tests.txt
  grep -E "^context" $R/gpu_page_mass_$i.txt >> $R/tests.txt
done
cat $R/tests.txt
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
