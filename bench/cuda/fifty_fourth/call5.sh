#!/usr/bin/env bash
# Fifty-fourth pass, call 5: the one-round plan's switch to one block a multiprocessor
# (plan::SHORT_CHUNK_PAGES = 56) measured near its bound: Qwen2.5-0.5B's dense step with an
# fp8 pool at steps whose two-block plan cuts chunks of about 51-63 pages, always two blocks
# (vortex_2b, the constant 0) against always one (vortex_1b, the constant 2^30), alternated.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu/rev; } > $OUT/info.txt
d() { # bin batch context
  echo "== $1 batch $2 context $3" >> $OUT/decode.txt
  timeout 60 $B/$1 bench decode --device cuda --random-weights .gpu/qwen25-0.5b.json --batch $2 --context $3 --flows dense --kv-dtype fp8 --decode-tokens 32 2>&1 | grep -E "^ +[0-9]+ +[0-9]+ dense|device ms|rror" >> $OUT/decode.txt
}
for round in 1 2; do
  for bc in "4 26k" "4 28k" "4 30k" "4 32k" "8 14k" "8 15k"; do set -- $bc
    for v in vortex_2b vortex_1b; do d $v $1 $2; done
  done
  echo "round $round done $SECONDS s" >> $OUT/info.txt
done
