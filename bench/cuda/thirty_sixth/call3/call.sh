#!/usr/bin/env bash
# The build before (vortex_old, 99c7ac4) against this one, alternated five times: the
# block_topk decode step of Qwen3-1.7B's shape (bench decode).
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
for i in 1 2 3 4 5; do
  for b in old new; do
    bin=./vortex; [ $b = old ] && bin=./vortex_old
    timeout 100 $bin bench decode --device cuda --random-weights qwen3-1.7b --batch 16 --context 32k --decode-tokens 32 --flows block_topk --budget 2k >> $R/bench_decode_$b.txt 2>&1
  done
done
for b in old new; do echo $b; grep -E "^ +16 " $R/bench_decode_$b.txt; done
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
