#!/usr/bin/env bash
# Session 48, call 1: each build's local memory and chosen build for the model geometries (current
# rule and the spill rule), then every GPU suite (the generated-index inline change first seen).
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/info.txt
geoms="32:8:128 16:8:128 14:2:64 4:1:256 32:8:64 8:1:128"
for v in vortex vortex_spill; do
  for g in $geoms; do IFS=: read q k d <<< "$g"
    echo "== $v $g" >> $OUT/att.txt
    timeout 60 $B/$v bench attention --device cuda --heads-q $q --heads-kv $k --head-dim $d --batch 16 --context 8k,32k --flows dense --kv-dtype bf16 --iters 20 >> $OUT/att.txt 2>&1
  done
done
echo "att done $SECONDS s" >> $OUT/info.txt
scripts/gpu_suites.sh run $B $OUT/suites > /dev/null 2>&1; echo "suites rc=$? $SECONDS s" >> $OUT/info.txt
cd $OUT/suites && tar czf ../suites.tgz *.txt && cd .. && cp suites/summary.txt . && rm -rf suites
