#!/usr/bin/env bash
# Sixty-first pass, call 2: every GPU suite on the build whose generated kernels widen an fp8
# pair at once; then the generated index phases of renamed copies of block_topk_fp8 and
# quest_fp8, this build and call 1's (`vortex_old`) alternated twice.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache RUST_TEST_NOCAPTURE=1
R=$OUT/r; mkdir -p $R
save() { tar czf $OUT/call2.tgz -C $OUT r; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
timeout 170 scripts/gpu_suites.sh run $B $R/suites > /dev/null 2>&1
echo "suites rc=$? $SECONDS s" >> $R/info.txt; save
F=bench/cuda/fiftieth/block_topk_fp8_custom.flow,bench/cuda/forty_eighth/quest_fp8_custom.flow
for run in new old new2 old2; do
  bin=$B/vortex; case $run in old*) bin=$B/vortex_old;; esac
  timeout 60 $bin bench attention --device cuda --batch 1,4,16 --context 32k,128k --budget 2k --iters 20 --flows $F --launches-per-timing 10 --json-out $R/gen_$run.json > $R/gen_$run.txt 2>&1
  echo "generated $run rc=$? $SECONDS s" >> $R/info.txt; save
done
python3 bench/cuda/fifty_ninth/parts_table.py old=$R/gen_old.json new=$R/gen_new.json old2=$R/gen_old2.json new2=$R/gen_new2.json > $R/gen_table.txt 2>&1
save
cat $R/info.txt $R/suites/summary.txt $R/gen_table.txt
