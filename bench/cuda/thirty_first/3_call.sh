#!/bin/bash
# call 3: B (allocations past the device refused up front, and the tests that build models held
# one at a time): gpu_graphs and gpu_engine once, gpu_model repeated; then A (the refusal
# alone) repeated
cd "$(dirname "$0")"
ulimit -c unlimited
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $OUT/3_machine.txt
for t in gpu_graphs gpu_engine; do
  s=$SECONDS; ./$t > $OUT/3_$t.txt 2>&1; echo "$t rc=$? $((SECONDS-s))s" >> $OUT/3_summary.txt
done
loop() { # binary seconds tag
  local start=$SECONDS i=0
  mkdir -p $OUT/$3
  while [ $((SECONDS - start)) -lt $2 ]; do
    i=$((i+1)); rm -f core*
    local s=$SECONDS
    RUST_BACKTRACE=1 timeout 60 ./$1 > $OUT/$3/$i.txt 2>&1
    local rc=$?
    echo "run $i rc=$rc $((SECONDS-s))s" >> $OUT/3_$3.txt
    [ $rc = 0 ] && rm $OUT/$3/$i.txt
    c=$(ls core* 2>/dev/null | head -1)
    if [ -n "$c" ]; then
      timeout 60 /usr/local/cuda/bin/cuda-gdb -q -batch -ex "bt 30" ./$1 $c > $OUT/$3/${i}_bt.txt 2>&1
      rm -f $c
    fi
  done
  echo "$3: $(grep -c 'rc=0' $OUT/3_$3.txt) of $i passed" >> $OUT/3_summary.txt
}
loop gpu_model 200 B
loop gpu_model_A 90 A
cat $OUT/3_summary.txt
