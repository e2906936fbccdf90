#!/usr/bin/env bash
# Run from the carried folder (.gpu): gpu_prefill_old is gpu_prefill's test binary built with
# the prefill kernels of db1cd42 and the new test; the other binaries are the first fix's build.
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
timeout 90 ./gpu_prefill_old gpu_prefill_a_later --nocapture > $R/nonfinite_old.txt 2>&1; echo "old kernels rc=$?" >> $R/summary.txt
timeout 90 ./gpu_prefill --nocapture > $R/prefill_new.txt 2>&1; echo "new gpu_prefill rc=$?" >> $R/summary.txt
for i in 1 2; do
  timeout 60 ./gpu_prefill_old --ignored gpu_prefill_speed --nocapture > $R/speed_old_$i.txt 2>&1
  timeout 60 ./gpu_prefill --ignored gpu_prefill_speed --nocapture > $R/speed_new_$i.txt 2>&1
done
timeout 360 ./gpu_suites.sh run . $OUT/suites
