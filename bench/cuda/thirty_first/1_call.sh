#!/bin/bash
# call 1: every GPU suite on HEAD, then gpu_model repeated (tests in parallel) until time runs out
cd "$(dirname "$0")"
start=$SECONDS
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $OUT/1_machine.txt
{ which gdb cuda-gdb; ls /usr/local/cuda/bin | head -50; cat /proc/sys/kernel/core_pattern; } > $OUT/1_tools.txt 2>&1
timeout 330 ./gpu_suites.sh run . $OUT/suites > /dev/null 2>&1
cp $OUT/suites/summary.txt $OUT/1_suites_summary.txt
tar czf $OUT/1_suite_logs.tgz -C $OUT suites && rm -rf $OUT/suites
mkdir -p $OUT/loop
i=0
while [ $((SECONDS - start)) -lt 540 ]; do
  i=$((i+1))
  timeout 40 ./gpu_model > $OUT/loop/$i.txt 2>&1
  echo "run $i rc=$?" >> $OUT/1_loop.txt
done
grep -c "rc=0" $OUT/1_loop.txt >> $OUT/1_loop.txt
for f in $OUT/loop/*.txt; do grep -q "test result: ok" $f && rm $f; done
echo done
