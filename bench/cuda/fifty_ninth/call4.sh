#!/usr/bin/env bash
# Fifty-ninth pass, call 4: the plan of blocks a row (h2o too), against a block a row, batch
# 1 to 16; the decode step at batch 1, 128K (Qwen3-8B's shape with a 128K context) with the
# build before (vortex_old) and this one; then every GPU suite.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
R=$OUT/r; mkdir -p $R
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
F=block_topk,block_topk_fp8,quest,quest_fp8,h2o
for P in 1 plan; do
  flag="--index-parts $P"; [ $P = plan ] && flag=""
  timeout 120 $B/vortex bench attention --device cuda --batch 1,2,4,8,16 --context 32k,128k --budget 2k --iters 20 --flows $F --launches-per-timing 10 $flag --json-out $R/parts_$P.json > $R/parts_$P.txt 2>&1
  echo "parts $P rc=$? $SECONDS s" >> $R/info.txt
done
python3 bench/cuda/fifty_ninth/parts_table.py p1=$R/parts_1.json plan=$R/parts_plan.json > $R/parts_table.txt 2>&1
for v in vortex_old vortex vortex_old vortex; do
  timeout 90 $B/$v bench decode --device cuda --random-weights bench/cuda/fifty_ninth/qwen3-8b-128k.json --batch 1 --context 128k --budget 2k --decode-tokens 32 --flows dense,block_topk,quest_fp8 >> $R/decode128k_$v.txt 2>&1
  echo "decode $v rc=$? $SECONDS s" >> $R/info.txt
done
timeout 300 scripts/gpu_suites.sh run $B $R/suites > /dev/null 2>&1
echo "suites rc=$? $SECONDS s" >> $R/info.txt
tar czf $OUT/call4.tgz -C $OUT r
cat $R/info.txt $R/parts_table.txt $R/suites/summary.txt
grep -h "131072" $R/decode128k_*.txt
