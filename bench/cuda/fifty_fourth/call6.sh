#!/usr/bin/env bash
# Fifty-fourth pass, call 6: as call 5 at more steps near the bound, three rounds, then the
# chunk lengths the two-block plan cuts at each (bench attention on Qwen2.5-0.5B's geometry).
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu/rev; } > $OUT/info.txt
d() { # bin batch context
  echo "== $1 batch $2 context $3" >> $OUT/decode.txt
  timeout 60 $B/$1 bench decode --device cuda --random-weights .gpu/qwen25-0.5b.json --batch $2 --context $3 --flows dense --kv-dtype fp8 --decode-tokens 32 2>&1 | grep -E "^ +[0-9]+ +[0-9]+ dense|device ms|rror" >> $OUT/decode.txt
}
steps="4 24k|4 26k|4 28k|4 30k|4 31k|5 24k|5 25k|6 20k|6 21k|8 14k|8 15k|12 10k|12 11k|16 8k"
for round in 1 2 3; do
  IFS='|'; for bc in $steps; do IFS=' '; set -- $bc
    for v in vortex_2b vortex_1b; do d $v $1 $2; done
  done; IFS=' '
  echo "round $round done $SECONDS s" >> $OUT/info.txt
done
for bc in "4 24k,26k,28k,30k,31k" "5 24k,25k" "6 20k,21k" "8 14k,15k" "12 10k,11k" "16 8k"; do set -- $bc
  timeout 60 $B/vortex_2b bench attention --device cuda --heads-q 14 --heads-kv 2 --head-dim 64 --kv-dtype fp8 --batch $1 --context $2 --flows dense --iters 5 >> $OUT/attention.txt 2>&1
done
echo "attention done $SECONDS s" >> $OUT/info.txt
