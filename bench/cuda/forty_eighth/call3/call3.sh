#!/usr/bin/env bash
# Session 48, call 3: head_dim 64 pages on the tensor cores (bf16 pools, 5-8 query heads a KV head).
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/info.txt
t0=$SECONDS; timeout 300 $B/gpu_attention > $OUT/gpu_attention.txt 2>&1; echo "gpu_attention rc=$? $((SECONDS-t0))s $(grep -h '^test result' $OUT/gpu_attention.txt | tail -1)" >> $OUT/info.txt
a() { echo "== $*" >> $OUT/att.txt; timeout 90 env "$@" --batch 1,16 --context 8k,32k --flows dense --kv-dtype bf16 --iters 20 >> $OUT/att.txt 2>&1; }
for m in 0 1; do
  a VORTEX_NO_MMA_ATTENTION=$m $B/vortex bench attention --device cuda --heads-q 14 --heads-kv 2 --head-dim 64
  a VORTEX_NO_MMA_ATTENTION=$m $B/vortex bench attention --device cuda --heads-q 16 --heads-kv 2 --head-dim 64
done
echo "att done $SECONDS s" >> $OUT/info.txt

d() { timeout 120 $B/$1 bench decode --device cuda --random-weights $2 --batch $3 --context $4 --flows dense,block_topk --budget 1k --decode-tokens 32 2>&1 | grep -E '^ +[0-9]' | sed "s|^|$1 $2 b$3 |" >> $OUT/decode.txt; }
for r in 1 2; do for v in vortex_old vortex; do d $v .gpu/qwen25-0.5b.json 16 8k,16k; d $v .gpu/qwen25-0.5b.json 1 16k; done; done
echo "decode done $SECONDS s" >> $OUT/info.txt
for t in gpu_page_mass gpu_graphs gpu_model gpu_engine; do t0=$SECONDS; timeout 150 $B/$t > $OUT/$t.txt 2>&1; echo "$t rc=$? $((SECONDS-t0))s $(grep -h '^test result' $OUT/$t.txt | tail -1)" >> $OUT/info.txt; done
