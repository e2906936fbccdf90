#!/usr/bin/env bash
# Sixty-third pass, call 1: every GPU suite on the pass's first commit (the `thread_cache` test
# flow's first GPU run among them), then the generated index phases timed as they stand.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins1.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
R=$OUT/r1; mkdir -p $R
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
bash scripts/gpu_suites.sh run $B $R/suites > $R/suites.txt 2>&1; echo "suites rc=$? $SECONDS s" >> $R/info.txt
F=crates/cuda/tests/flows
# The Qwen3-8B shape at 1, 2 and 4 blocks a row (more warps a multiprocessor), then 16 x 128.
for run in "--heads-q 32 --heads-kv 8 --head-dim 128" "--heads-q 32 --heads-kv 8 --head-dim 128 --index-parts 1" \
    "--heads-q 32 --heads-kv 8 --head-dim 128 --index-parts 2" "--heads-q 32 --heads-kv 8 --head-dim 128 --index-parts 4" \
    "--heads-q 16 --heads-kv 8 --head-dim 128"; do
  echo "## $run" >> $R/index.txt
  timeout 100 $B/vortex bench attention --device cuda --batch 16 --context 32k --budget 2k --iters 20 \
    --launches-per-timing 10 --kv-dtype bf16 $run \
    --flows double_sparse,lsh,$F/reductions.flow,$F/wide.flow,$F/halves_fp8.flow,$F/thread_cache.flow >> $R/index.txt 2>&1
  echo "bench rc=$? $SECONDS s" >> $R/info.txt
done
tar czf $OUT/call1.tgz -C $OUT r1
cat $R/info.txt $R/suites/summary.txt; cat $R/index.txt | cut -c1-150 | head -80
