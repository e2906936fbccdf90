#!/bin/bash
# call 4: the final build's gpu_model repeated (tests in parallel)
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $OUT/4_machine.txt
start=$SECONDS i=0
mkdir -p $OUT/F
while [ $((SECONDS - start)) -lt 110 ]; do
  i=$((i+1))
  RUST_BACKTRACE=1 timeout 60 ./gpu_model > $OUT/F/$i.txt 2>&1
  rc=$?
  echo "run $i rc=$rc" >> $OUT/4_F.txt
  [ $rc = 0 ] && rm $OUT/F/$i.txt
done
echo "F: $(grep -c 'rc=0' $OUT/4_F.txt) of $i passed" | tee $OUT/4_summary.txt
