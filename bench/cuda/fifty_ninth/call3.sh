#!/usr/bin/env bash
# Fifty-ninth pass, call 3: the index phase's blocks a row swept (1, 2, 4, 8) at batch 1 to 8,
# then the build's own plan; the decode step at batch 1 and 4 with the build before (vortex_old)
# and this one, alternated twice.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
R=$OUT/r; mkdir -p $R
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
F=block_topk,block_topk_fp8,quest,quest_fp8
for P in 1 2 4 8 plan; do
  flag="--index-parts $P"; [ $P = plan ] && flag=""
  timeout 120 $B/vortex bench attention --device cuda --batch 1,2,4,8 --context 32k,128k --budget 2k --iters 20 --flows $F --launches-per-timing 10 $flag --json-out $R/parts_$P.json > $R/parts_$P.txt 2>&1
  echo "parts $P rc=$? $SECONDS s" >> $R/info.txt
done
python3 bench/cuda/fifty_ninth/parts_table.py p1=$R/parts_1.json p2=$R/parts_2.json p4=$R/parts_4.json p8=$R/parts_8.json plan=$R/parts_plan.json > $R/parts_table.txt 2>&1
for round in 1 2; do
  for v in vortex_old vortex; do
    timeout 60 $B/$v bench decode --device cuda --random-weights qwen3-8b --batch 1,4 --context 32k --budget 2k --decode-tokens 32 --flows dense,block_topk,quest_fp8 > $R/decode_${v}_r$round.txt 2>&1
    echo "decode $v $round rc=$? $SECONDS s" >> $R/info.txt
  done
done
tar czf $OUT/call3.tgz -C $OUT r
cat $R/info.txt $R/parts_table.txt
grep -h "block_topk \|quest_fp8 \|dense " $R/decode_*_r2.txt
