#!/usr/bin/env bash
# Page masses on the tensor cores: pages a block (CHUNK_PAGES, from VORTEX_PM_CHUNK in a scratch
# build) 32 / 64 (the default) / 128, alternated twice; gpu_page_mass at 128; the measuring
# kernels of one 8K and one 32K layer under Nsight Compute at the default.
cd "$(dirname "$0")" && tar xJf bins.tar.xz
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
for i in 1 2; do
  for c in 32 64 128; do
    echo "== chunk $c run $i" >> $R/chunk_ab.txt
    VORTEX_PM_CHUNK=$c timeout 60 ./gpu_page_mass_env --ignored page_mass_speed --nocapture 2>&1 | grep -E "^context" >> $R/chunk_ab.txt
  done
done
cat $R/chunk_ab.txt
VORTEX_PM_CHUNK=128 timeout 100 ./gpu_page_mass_env --nocapture > $R/gpu_page_mass_128.txt 2>&1
echo "gpu_page_mass chunk 128 rc=$? $(grep -h '^test result' $R/gpu_page_mass_128.txt | tail -1)" >> $R/tests.txt
cat $R/tests.txt
timeout 120 ncu --kernel-name regex:page_mass --launch-skip 66 --launch-count 6 --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size ./gpu_page_mass_env --ignored page_mass_speed --nocapture > $R/ncu.csv 2> $R/ncu_err.txt
grep -E "gpu__time_duration" $R/ncu.csv | cut -d, -f5,16-
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
