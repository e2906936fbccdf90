#!/usr/bin/env bash
# Sixty-fourth pass, call 2: products by the query read by its sign in the lane form: generated
# index phases of the working tree (`vortex`, 245756f) against 58b35f9 (`vortex_old`, the same
# kernels as dd1d40d), alternated twice at two shapes, the hand-written quest kernels beside
# them; then every GPU suite on the working tree.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins2_64.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
R=$OUT/r2; mkdir -p $R
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
F=crates/cuda/tests/flows G=/tmp/gen; mkdir -p $G
for f in quest block_topk quest_fp8; do sed "s/^flow $f /flow ${f}_gen /" crates/flow/flows/$f.flow > $G/${f}_gen.flow; done
flows=quest,quest_fp8,$G/quest_gen.flow,$G/quest_fp8_gen.flow,$G/block_topk_gen.flow,$F/wide.flow,$F/products.flow,$F/reductions.flow
for shape in "32:8:128" "16:8:128"; do
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
tar czf $OUT/call2.tgz -C $OUT r2
rm -rf $R/all
cat $R/info.txt $R/all.txt
