#!/usr/bin/env bash
# Fifty-third pass, call 2: CPU decode attention on the GPU host's 16 cores: the build before
# the batch-invariant CPU kernels (vortex_old, 37b161a), the build with them (vortex, f2e6a5f),
# and rows cut into chunks by their length alone, shared out among threads in runs of chunks
# (vortex_new), alternated.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
{ date -u; nproc; lscpu | grep -E "Model name|Thread|Socket|NUMA node\(s\)"; } > $OUT/info.txt
for round in 1 2; do
  for cfg in "1 4k dense" "1 32k dense" "64 4k dense" "16 32k dense" "64 32k block_topk"; do
    set -- $cfg
    for bin in vortex_old vortex vortex_new; do
      echo "== round $round $bin batch $1 context $2 flows $3" >> $OUT/cpu.txt
      timeout 100 $B/$bin bench attention --batch $1 --context $2 --flows $3 --kv-dtype bf16 --iters 9 --threads 16 >> $OUT/cpu.txt 2>&1
    done
  done
done
echo "cpu done $SECONDS s" >> $OUT/info.txt
