#!/usr/bin/env bash
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
timeout 120 ./gpu_prefill --nocapture > $R/prefill_new.txt 2>&1; echo "new gpu_prefill rc=$?" >> $R/summary.txt
for i in 1 2; do
  for b in old scan new; do
    f=./gpu_prefill_$b; [ $b = new ] && f=./gpu_prefill
    timeout 60 $f --ignored gpu_prefill_speed --nocapture > $R/speed_${b}_$i.txt 2>&1
  done
done
cd $R && tar czf $OUT/r.tgz . && cd .. && rm -rf $R
