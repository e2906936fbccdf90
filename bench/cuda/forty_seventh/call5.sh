#!/usr/bin/env bash
# Call 5: dense decode attention in Gemma 3's geometry (4 query heads over 1 KV head of 256), every build variant, the build before and this one.
set -u
B=/tmp/bins; mkdir -p $B; [ -x $B/vortex ] || tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
for v in vortex_old vortex; do for g in "4 1 256" "8 1 256"; do set -- $g
  echo "== $v $g" >> $OUT/att.txt
  timeout 90 $B/$v bench attention --device cuda --heads-q $1 --heads-kv $2 --head-dim $3 --batch 16 --context 512,8k,32k --flows dense --iters 30 >> $OUT/att.txt 2>&1
done; done
