#!/usr/bin/env bash
# After review: gpu_graphs with a quest_fp8 replay test, gpu_block_topk (comments changed in
# block_topk.cu).
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
for t in gpu_graphs gpu_block_topk; do
  timeout 200 ./$t > $R/$t.txt 2>&1; echo "$t rc=$? $(grep -h '^test result' $R/$t.txt | tail -1)" >> $R/tests.txt
done
grep -h "^test " $R/gpu_graphs.txt
cat $R/tests.txt
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
