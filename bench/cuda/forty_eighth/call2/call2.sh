#!/usr/bin/env bash
# Session 48, call 2: the one-round rule (the 8-warp build wherever its plan fits one round).
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/info.txt
for s in "" --sequential-pages; do
  echo "== qwen3-8b attention $s" >> $OUT/att.txt
  timeout 90 $B/vortex bench attention --device cuda --batch 1,4 --context 32k,128k --flows dense --kv-dtype bf16 --iters 20 $s >> $OUT/att.txt 2>&1
done
echo "att done $SECONDS s" >> $OUT/info.txt
d() { timeout 120 $B/$1 bench decode --device cuda --random-weights $2 --batch $3 --context $4 --flows dense --decode-tokens 32 2>&1 | grep -E '^ +[0-9]' | sed "s|^|$1 $2 b$3 |" >> $OUT/decode.txt; }
for r in 1 2; do
  for v in vortex_old vortex; do
    d $v qwen3-1.7b 1 32k; d $v qwen3-1.7b 4 32k; d $v qwen3-8b 1 32k
    d $v .gpu/qwen25-0.5b.json 16 8k,32k
  done
done
echo "decode done $SECONDS s" >> $OUT/info.txt
for t in gpu_graphs gpu_model gpu_engine; do t0=$SECONDS; timeout 150 $B/$t > $OUT/$t.txt 2>&1; echo "$t rc=$? $((SECONDS-t0))s $(grep -h '^test result' $OUT/$t.txt | tail -1)" >> $OUT/info.txt; done
