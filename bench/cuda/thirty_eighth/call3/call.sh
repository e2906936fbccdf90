#!/usr/bin/env bash
# The committed quest_fp8 build (6119663): every GPU suite; then the sparse steps at 32K
# (batch 16, budget 2K; block_topk, quest, quest_fp8) from this build and from a scratch
# build whose fp8 envelopes load two tiles a step (vortex_st2), alternated twice; then
# 8K and 128K on this build.
cd "$(dirname "$0")" && tar xJf bins.tar.xz
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
timeout 360 ./gpu_suites.sh run . $R/suites > /dev/null 2>&1
cat $R/suites/summary.txt
for i in 1 2; do
  for b in vortex vortex_st2; do
    echo "== $b run $i" >> $R/ab.txt
    timeout 60 ./$b bench attention --device cuda --batch 16 --context 32k --budget 2k --flows block_topk,quest,quest_fp8 --iters 50 2>&1 | grep -E "default|flow batch" >> $R/ab.txt
  done
done
cat $R/ab.txt
timeout 120 ./vortex bench attention --device cuda --batch 16 --context 8k,128k --budget 2k --flows block_topk,quest,quest_fp8 --iters 50 > $R/attention_8k_128k.txt 2>&1
grep -E "default|flow batch" $R/attention_8k_128k.txt
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
