#!/usr/bin/env bash
# Fifty-fourth pass, call 2: CPU decode attention on the GPU host's 16 cores, the build before
# the batch-invariant CPU kernels (vortex_old, 37b161a) against the committed one whose chunks
# follow the row's length alone (vortex, d9fa6cb), alternated, the order flipped each round.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
{ date -u; cat .gpu/rev; nproc; lscpu | grep -E "Model name|Thread|Socket|NUMA node\(s\)"; } > $OUT/info.txt
for round in 1 2 3 4; do
  if [ $((round % 2)) = 1 ]; then bins="vortex_old vortex"; else bins="vortex vortex_old"; fi
  for cfg in "1 4k" "64 4k" "16 32k" "64 32k"; do
    set -- $cfg
    for bin in $bins; do
      echo "== round $round $bin batch $1 context $2" >> $OUT/cpu.txt
      timeout 60 $B/$bin bench attention --batch $1 --context $2 --flows dense --kv-dtype bf16 --iters 9 --threads 16 >> $OUT/cpu.txt 2>&1
    done
  done
  echo "round $round done $SECONDS s" >> $OUT/info.txt
done
