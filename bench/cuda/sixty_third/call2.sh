#!/usr/bin/env bash
# Sixty-third pass, call 2: generated index phases whose fields are staged, with the next tile
# copied while one is scored (`vortex`, the working tree) against `701594b` (`vortex_old`),
# alternated twice at three shapes; then every GPU suite on the working tree.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins2.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
R=$OUT/r2; mkdir -p $R
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
F=crates/cuda/tests/flows G=/tmp/gen; mkdir -p $G
# Built-in flows under another name take their generated kernels.
for f in quest block_topk double_sparse; do sed "s/^flow $f /flow ${f}_gen /" crates/flow/flows/$f.flow > $G/${f}_gen.flow; done
flows=lsh,$G/double_sparse_gen.flow,$G/quest_gen.flow,$G/block_topk_gen.flow,$F/reductions.flow,$F/wide.flow,$F/halves_fp8.flow,$F/thread_cache.flow
for shape in "32:8:128" "16:8:128" "14:2:64"; do
  IFS=: read hq hk d <<< "$shape"
  for run in 1 2; do
    for bin in vortex_old vortex; do
      echo "## $bin $shape run $run" >> $R/index.txt
      timeout 120 $B/$bin bench attention --device cuda --batch 16 --context 32k --budget 2k --iters 20 \
        --launches-per-timing 10 --kv-dtype bf16 --heads-q $hq --heads-kv $hk --head-dim $d \
        --flows $flows >> $R/index.txt 2>&1
      echo "$bin $shape $run rc=$? $SECONDS s" >> $R/info.txt
    done
  done
done
bash scripts/gpu_suites.sh run $B $R/suites > $R/suites.txt 2>&1; echo "suites rc=$? $SECONDS s" >> $R/info.txt
tar czf $OUT/call2.tgz -C $OUT r2
cat $R/info.txt $R/suites/summary.txt
grep -E "^##|index|_gen|reductions|wide|halves|thread_cache|lsh" $R/index.txt | cut -c1-160 | head -120
