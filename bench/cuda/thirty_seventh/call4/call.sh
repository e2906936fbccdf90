#!/usr/bin/env bash
# What measuring a layer costs (page_mass_speed), the engine test of measured recall, then the
# measuring kernels under Nsight Compute.
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
timeout 200 ./gpu_page_mass --ignored page_mass_speed --nocapture > $R/speed.txt 2>&1
cat $R/speed.txt
timeout 100 ./gpu_engine measures_recall > $R/gpu_engine.txt 2>&1
grep -E "^test |^cpu|^gpu|panicked" -A2 $R/gpu_engine.txt | head -40
timeout 300 ncu --kernel-name regex:page_mass --launch-skip 9 --launch-count 6 --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,sm__throughput.avg.pct_of_peak_sustained_elapsed ./gpu_page_mass --ignored page_mass_speed --nocapture > $R/ncu.csv 2> $R/ncu_err.txt
grep -E "page_mass" $R/ncu.csv | cut -c1-400 | head -40
tail -5 $R/ncu_err.txt
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
