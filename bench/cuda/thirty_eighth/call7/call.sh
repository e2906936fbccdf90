#!/usr/bin/env bash
# page_mass_recall with the kept pages in a shared hash set and the k-th largest mass found a
# byte at a time, ties ranked by the block: gpu_page_mass with its speed test, gpu_engine; the measuring kernels of one
# 8K and one 32K layer under Nsight Compute.
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
timeout 200 ./gpu_page_mass --include-ignored --nocapture > $R/gpu_page_mass.txt 2>&1
echo "gpu_page_mass rc=$? $(grep -h '^test result' $R/gpu_page_mass.txt | tail -1)" >> $R/tests.txt
timeout 150 ./gpu_engine > $R/gpu_engine.txt 2>&1; echo "gpu_engine rc=$? $(grep -h '^test result' $R/gpu_engine.txt | tail -1)" >> $R/tests.txt
grep -E "^copy|^context" $R/gpu_page_mass.txt
cat $R/tests.txt
timeout 120 ncu --kernel-name regex:page_mass --launch-skip 66 --launch-count 6 --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size ./gpu_page_mass --ignored page_mass_speed --nocapture > $R/ncu.csv 2> $R/ncu_err.txt
grep -E "gpu__time_duration" $R/ncu.csv | cut -d, -f5,16-
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
