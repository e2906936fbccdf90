#!/usr/bin/env bash
# Sixty-first pass, call 4: the build that fetches bf16 centroids two steps ahead into L2
# (block_topk) and the rest one step ahead, against 5faccc7 (`vortex_old`) alternated twice;
# then every suite. `vortex` and the suites are 8508da9 with fp8_clusters.patch applied (the fp8
# weight products ask the driver for their largest cluster).
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache RUST_TEST_NOCAPTURE=1
R=$OUT/r4; mkdir -p $R
save() { tar czf $OUT/call4.tgz -C $OUT r4; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
for run in new old new2 old2; do
  bin=$B/vortex; case $run in old*) bin=$B/vortex_old;; esac
  timeout 40 $bin bench attention --device cuda --batch 4,16 --context 32k --budget 2k --iters 50 --launches-per-timing 10 --flows block_topk,block_topk_fp8,quest_fp8,h2o --json-out $R/$run.json > $R/$run.txt 2>&1
  echo "$run rc=$? $SECONDS s" >> $R/info.txt; save
done
python3 bench/cuda/fifty_ninth/parts_table.py old=$R/old.json new=$R/new.json old2=$R/old2.json new2=$R/new2.json > $R/table.txt 2>&1
save
timeout 200 scripts/gpu_suites.sh run $B $R/suites > /dev/null 2>&1
echo "suites rc=$? $SECONDS s" >> $R/info.txt; save
cat $R/info.txt $R/table.txt $R/suites/summary.txt
