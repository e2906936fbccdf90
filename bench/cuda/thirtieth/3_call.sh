#!/bin/bash
# call 3: every GPU suite on the build with split query-head groups; wide groups before and after
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $OUT/3_machine.txt
timeout 330 ./gpu_suites.sh run . $OUT/suites > /dev/null 2>&1
cp $OUT/suites/summary.txt $OUT/3_suites_summary.txt
tar czf $OUT/3_suite_logs.tgz -C $OUT suites && rm -rf $OUT/suites
for b in old new; do
  bin=./vortex; [ $b = old ] && bin=./vortex_old
  for geo in "--heads-q 128 --heads-kv 8 --batch 2 --context 4k" "--heads-q 64 --heads-kv 4 --batch 16 --context 8k,32k" "--heads-q 40 --heads-kv 4 --batch 16 --context 32k"; do
    echo "== $b $geo" >> $OUT/3_wide_groups.txt
    timeout 100 $bin bench attention --device cuda $geo --flows block_topk --budget 2k --iters 20 >> $OUT/3_wide_groups.txt 2>&1
    echo "rc=$?" >> $OUT/3_wide_groups.txt
  done
  echo "== $b 32q/8kv" >> $OUT/3_wide_groups.txt
  timeout 100 $bin bench attention --device cuda --batch 16 --context 32k --flows block_topk --budget 2k --iters 50 >> $OUT/3_wide_groups.txt 2>&1
done
echo done
