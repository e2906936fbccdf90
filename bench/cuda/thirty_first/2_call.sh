#!/bin/bash
# call 2: gpu_model repeated (tests in parallel) with core dumps; each crash's threads' backtraces
cd "$(dirname "$0")"
start=$SECONDS
ulimit -c unlimited
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $OUT/2_machine.txt
mkdir -p $OUT/loop
i=0; crashes=0
while [ $((SECONDS - start)) -lt 480 ] && [ $crashes -lt 4 ]; do
  i=$((i+1))
  rm -f core core.*
  RUST_BACKTRACE=1 timeout 40 ./gpu_model > $OUT/loop/$i.txt 2>&1
  rc=$?
  echo "run $i rc=$rc" >> $OUT/2_loop.txt
  if [ $rc = 0 ]; then rm $OUT/loop/$i.txt; fi
  c=$(ls core* 2>/dev/null | head -1)
  if [ -n "$c" ]; then
    crashes=$((crashes+1))
    ls -la $c >> $OUT/loop/$i.txt
    timeout 60 /usr/local/cuda/bin/cuda-gdb -q -batch -ex "info threads" -ex "thread apply all bt 40" ./gpu_model $c > $OUT/loop/${i}_bt.txt 2>&1
    rm -f $c
  fi
done
grep -c "rc=0" $OUT/2_loop.txt >> $OUT/2_loop.txt
echo done
