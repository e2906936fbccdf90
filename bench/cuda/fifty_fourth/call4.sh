#!/usr/bin/env bash
# Fifty-fourth pass, call 4: CPU prefill and decode of random Qwen3-0.6B weights on the GPU
# host's 16 cores, the build before the products' calls of 8 tokens (vortex_base, 2865e96)
# against f273def (vortex), alternated.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
{ date -u; cat .gpu/rev; nproc; lscpu | grep -E "Model name|L1d|L2"; } > $OUT/info.txt
for round in 1 2 3; do
  for bin in vortex_base vortex; do
    echo "== round $round $bin" >> $OUT/cpu.txt
    timeout 80 $B/$bin bench decode --random-weights qwen3-0.6b --context 512,4k --flows dense --decode-tokens 8 --threads 16 >> $OUT/cpu.txt 2>&1
  done
done
echo "done $SECONDS s" >> $OUT/info.txt
