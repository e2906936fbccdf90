#!/usr/bin/env bash
# Sixty-first pass, call 1: every GPU suite on the build whose generated index phases widen fp8
# fields in hardware and keep an accumulator per query head; then the generated index phases
# (lsh, double_sparse and renamed copies of block_topk, block_topk_fp8, quest and quest_fp8),
# this build then the one before (`vortex_old`).
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache RUST_TEST_NOCAPTURE=1
R=$OUT/r; mkdir -p $R
save() { tar czf $OUT/call1.tgz -C $OUT r; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
timeout 220 scripts/gpu_suites.sh run $B $R/suites > /dev/null 2>&1
echo "suites rc=$? $SECONDS s" >> $R/info.txt; save
F=lsh,double_sparse,bench/cuda/fiftieth/block_topk_custom.flow,bench/cuda/fiftieth/block_topk_fp8_custom.flow,bench/cuda/sixtieth/quest_custom.flow,bench/cuda/forty_eighth/quest_fp8_custom.flow
for run in new old; do
  bin=$B/vortex; [ $run = old ] && bin=$B/vortex_old
  timeout 120 $bin bench attention --device cuda --batch 1,4,16 --context 32k,128k --budget 2k --iters 20 --flows $F --launches-per-timing 10 --json-out $R/gen_$run.json > $R/gen_$run.txt 2>&1
  echo "generated $run rc=$? $SECONDS s" >> $R/info.txt; save
done
python3 bench/cuda/fifty_ninth/parts_table.py old=$R/gen_old.json new=$R/gen_new.json > $R/gen_table.txt 2>&1
save
cat $R/info.txt $R/suites/summary.txt $R/gen_table.txt
