#!/usr/bin/env bash
# Session 48, call 4: fp8 pages at head_dim 64 on the tensor cores, and generated index phases
# reading register-held fields in place (quest_fp8 at head_dim 64). Not run: the session's
# device machines stopped starting. Its .gpu/bins.tar.xz held `vortex`, `gpu_attention` and
# `gpu_generated_flows` built from 57652be with fp8_head64_tensor_cores.patch applied, and
# `vortex_old` built from 1530fa5 (`scripts/gpu_suites.sh pack`, then strip).
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/info.txt
s() { t0=$SECONDS; timeout 400 $B/$1 > $OUT/$1.txt 2>&1; echo "$1 rc=$? $((SECONDS-t0))s $(grep -h '^test result' $OUT/$1.txt | tail -1)" >> $OUT/info.txt; }
s gpu_attention
a() { echo "== $*" >> $OUT/att.txt; timeout 90 env "$@" --batch 1,16 --context 8k,32k --flows dense --kv-dtype fp8 --iters 20 >> $OUT/att.txt 2>&1; }
for g in "14 2" "9 3" "32 8"; do set -- $g
  for m in 1 0; do a VORTEX_NO_MMA_ATTENTION=$m $B/vortex bench attention --device cuda --heads-q $1 --heads-kv $2 --head-dim 64; done
done
echo "att done $SECONDS s" >> $OUT/info.txt
for v in vortex_old vortex; do
  echo "== $v" >> $OUT/flow.txt
  timeout 90 $B/$v bench attention --device cuda --heads-q 14 --heads-kv 2 --head-dim 64 --batch 16 --context 8k,32k --budget 2k --flows bench/cuda/forty_eighth/quest_fp8_custom.flow,quest_fp8 --kv-dtype bf16 --iters 20 >> $OUT/flow.txt 2>&1
done
echo "flow done $SECONDS s" >> $OUT/info.txt
s gpu_generated_flows
