#!/usr/bin/env bash
# Sixtieth pass, call 1: every GPU suite on the build with h2o's split and the driver's cluster
# bound; then batch 16 (where the plan keeps one block a row) split 2 and 4 ways; the plan
# against one block a row at batch 1 to 16 (h2o too); the decode step at batch 1 and 128K
# (Qwen3-8B's shape with a 128K context) with the build before (vortex_old) and this one.
# Outputs are tarred after each stage ($OUT/call1.tgz): a call returns at most eight files.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
R=$OUT/r; mkdir -p $R
save() { tar czf $OUT/call1.tgz -C $OUT r; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
timeout 300 scripts/gpu_suites.sh run $B $R/suites > /dev/null 2>&1
echo "suites rc=$? $SECONDS s" >> $R/info.txt; save
F=block_topk,block_topk_fp8,quest,quest_fp8,h2o
for P in 1 2 4; do
  timeout 60 $B/vortex bench attention --device cuda --batch 16 --context 32k,128k --budget 2k --iters 20 --flows $F --launches-per-timing 10 --index-parts $P --json-out $R/b16_parts_$P.json > $R/b16_parts_$P.txt 2>&1
  echo "b16 parts $P rc=$? $SECONDS s" >> $R/info.txt
done
save
for P in 1 plan; do
  flag="--index-parts $P"; [ $P = plan ] && flag=""
  timeout 120 $B/vortex bench attention --device cuda --batch 1,2,4,8,16 --context 32k,128k --budget 2k --iters 20 --flows $F --launches-per-timing 10 $flag --json-out $R/parts_$P.json > $R/parts_$P.txt 2>&1
  echo "parts $P rc=$? $SECONDS s" >> $R/info.txt
done
python3 bench/cuda/fifty_ninth/parts_table.py p1=$R/parts_1.json plan=$R/parts_plan.json b16p1=$R/b16_parts_1.json b16p2=$R/b16_parts_2.json b16p4=$R/b16_parts_4.json > $R/parts_table.txt 2>&1
save
for v in vortex_old vortex; do
  timeout 90 $B/$v bench decode --device cuda --random-weights bench/cuda/fifty_ninth/qwen3-8b-128k.json --batch 1 --context 128k --budget 2k --decode-tokens 32 --flows dense,block_topk,quest_fp8 >> $R/decode128k_$v.txt 2>&1
  echo "decode $v rc=$? $SECONDS s" >> $R/info.txt
done
save
cat $R/info.txt $R/suites/summary.txt $R/parts_table.txt
grep -h "131072" $R/decode128k_*.txt
