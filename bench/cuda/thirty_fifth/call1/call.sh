#!/usr/bin/env bash
# Several flows in one step: every GPU suite on this build, then `vortex bench attention` at 32K
# (block_topk, quest, h2o) on the build before (vortex_old, 6bac7a9) and this one alternated,
# for what the index kernels' ready flag by table row costs.
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
timeout 360 ./gpu_suites.sh run . $R/suites
for b in old new old new; do
  bin=./vortex; [ $b = old ] && bin=./vortex_old
  timeout 60 $bin bench attention --device cuda --batch 16 --context 32k --budget 2k --flows block_topk,quest,h2o --iters 50 >> $R/bench_attention_$b.txt 2>&1
done
grep -h "<- default" $R/bench_attention_*.txt | grep -v "^ *16 "
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
