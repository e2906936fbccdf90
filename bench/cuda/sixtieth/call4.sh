#!/usr/bin/env bash
# Sixtieth pass, call 4: every GPU suite (their output uncaptured, so gpu_generated_flows lists
# the blocks a row each flow took) on the build whose generated index phases split rows over
# clusters; then the generated index phases (lsh, and renamed copies of block_topk,
# block_topk_fp8, quest and quest_fp8) with one block a row and as planned, batch 1, 4, 16.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache RUST_TEST_NOCAPTURE=1
R=$OUT/r; mkdir -p $R
save() { tar czf $OUT/call4.tgz -C $OUT r; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
timeout 200 scripts/gpu_suites.sh run $B $R/suites > /dev/null 2>&1
echo "suites rc=$? $SECONDS s" >> $R/info.txt; save
F=lsh,bench/cuda/fiftieth/block_topk_custom.flow,bench/cuda/fiftieth/block_topk_fp8_custom.flow,bench/cuda/sixtieth/quest_custom.flow,bench/cuda/forty_eighth/quest_fp8_custom.flow
for P in plan 1; do
  flag="--index-parts $P"; [ $P = plan ] && flag=""
  timeout 100 $B/vortex bench attention --device cuda --batch 1,4,16 --context 32k,128k --budget 2k --iters 20 --flows $F --launches-per-timing 10 $flag --json-out $R/gen_$P.json > $R/gen_$P.txt 2>&1
  echo "generated parts $P rc=$? $SECONDS s" >> $R/info.txt
done
python3 bench/cuda/fifty_ninth/parts_table.py p1=$R/gen_1.json plan=$R/gen_plan.json > $R/gen_table.txt 2>&1
save
cat $R/info.txt $R/suites/summary.txt $R/gen_table.txt
grep -h "compared" $R/suites/gpu_generated_flows.txt
