#!/usr/bin/env bash
# page_mass.cu's block reductions through one helper (pm_block_reduce): gpu_page_mass with its
# speed test, gpu_engine (its measured-recall test against the CPU engine).
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
timeout 200 ./gpu_page_mass --include-ignored --nocapture > $R/gpu_page_mass.txt 2>&1
echo "gpu_page_mass rc=$? $(grep -h '^test result' $R/gpu_page_mass.txt | tail -1)" >> $R/tests.txt
timeout 150 ./gpu_engine > $R/gpu_engine.txt 2>&1; echo "gpu_engine rc=$? $(grep -h '^test result' $R/gpu_engine.txt | tail -1)" >> $R/tests.txt
grep -E "^copy|^context" $R/gpu_page_mass.txt
cat $R/tests.txt
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
