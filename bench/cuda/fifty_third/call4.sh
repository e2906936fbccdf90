#!/usr/bin/env bash
# Fifty-third pass, call 4: call 3's two builds again, only where call 3 left a doubt (large
# batches, dense at 4K and block_topk at 32K), more rounds.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
date -u > $OUT/info.txt
for round in 1 2 3 4 5; do
  for cfg in "64 4k dense" "64 32k block_topk"; do
    set -- $cfg
    for bin in vortex_old vortex_new; do
      echo "== round $round $bin batch $1 context $2 flows $3" >> $OUT/cpu.txt
      timeout 60 $B/$bin bench attention --batch $1 --context $2 --flows $3 --kv-dtype bf16 --iters 9 --threads 16 >> $OUT/cpu.txt 2>&1
    done
  done
done
echo "cpu done $SECONDS s" >> $OUT/info.txt
