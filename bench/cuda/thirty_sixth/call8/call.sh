#!/usr/bin/env bash
# The final build (the selection's grouping as plain functions): the suites that run it.
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
for t in gpu_model gpu_engine gpu_graphs gpu_block_topk gpu_h2o; do
  timeout 150 ./$t > $R/$t.txt 2>&1; echo "$t rc=$? $(grep -h '^test result' $R/$t.txt | tail -1)" >> $R/tests.txt
done
cat $R/tests.txt
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
