#!/usr/bin/env bash
# Sixty-third pass, call 4: the lane form of generated index phases (a few lanes a page, the
# query's columns in registers): its index phases (`vortex`, the working tree) against
# `a54a652` (`vortex_old`), alternated twice at two shapes, then every GPU suite.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins3.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
R=$OUT/r4; mkdir -p $R
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
F=crates/cuda/tests/flows G=/tmp/gen; mkdir -p $G
for f in quest block_topk quest_fp8; do sed "s/^flow $f /flow ${f}_gen /" crates/flow/flows/$f.flow > $G/${f}_gen.flow; done
flows=lsh,$G/quest_gen.flow,$G/block_topk_gen.flow,$G/quest_fp8_gen.flow,$F/reductions.flow,$F/wide.flow,$F/halves_fp8.flow,$F/thread_cache.flow
for shape in "32:8:128" "14:2:64"; do
  IFS=: read hq hk d <<< "$shape"
  for run in 1 2; do
    for bin in vortex_old vortex; do
      echo "## $bin $shape run $run" >> $R/index.txt
      timeout 100 $B/$bin bench attention --device cuda --batch 16 --context 32k --budget 2k --iters 20 \
        --launches-per-timing 10 --kv-dtype bf16 --heads-q $hq --heads-kv $hk --head-dim $d \
        --flows $flows >> $R/index.txt 2>&1
      echo "$bin $shape $run rc=$? $SECONDS s" >> $R/info.txt
    done
  done
done
bash scripts/gpu_suites.sh run $B $R/all > $R/all.txt 2>&1; echo "suites rc=$? $SECONDS s" >> $R/info.txt
tar czf $OUT/call4.tgz -C $OUT r4
rm -rf $R/all
cat $R/info.txt $R/all.txt
