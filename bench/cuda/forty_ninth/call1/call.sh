#!/usr/bin/env bash
# Session 49, call 1: every GPU suite on 1d863d3 with fp8_head64_tensor_cores.patch (bench/cuda/
# forty_eighth/); fp8 attention at head_dim 64 with and without the tensor cores; a custom
# quest_fp8 (generated index) before (1530fa5, `vortex_old`) and after the generated-index
# change; Qwen2.5-0.5B's step, fp8 pool. .gpu/bins.tar.xz: `scripts/gpu_suites.sh pack`, strip.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/info.txt
t0=$SECONDS
timeout 300 bash scripts/gpu_suites.sh run $B /tmp/suites > /dev/null 2>&1
echo "suites $((SECONDS-t0))s" >> $OUT/info.txt
cp /tmp/suites/summary.txt $OUT/summary.txt
tar czf $OUT/suites.tgz -C /tmp suites
a() { echo "== $*" >> $OUT/att.txt; timeout 40 env "$@" --batch 1,16 --context 8k,32k --flows dense --kv-dtype fp8 --iters 20 >> $OUT/att.txt 2>&1; }
for g in "14 2" "9 3" "32 8"; do set -- $g
  for m in 1 0; do a VORTEX_NO_MMA_ATTENTION=$m $B/vortex bench attention --device cuda --heads-q $1 --heads-kv $2 --head-dim 64; done
done
echo "att done $SECONDS s" >> $OUT/info.txt
for v in vortex_old vortex; do
  echo "== $v" >> $OUT/flow.txt
  timeout 40 $B/$v bench attention --device cuda --heads-q 14 --heads-kv 2 --head-dim 64 --batch 16 --context 8k,32k --budget 2k --flows .gpu/quest_fp8_custom.flow,quest_fp8 --kv-dtype bf16 --iters 20 >> $OUT/flow.txt 2>&1
done
echo "flow done $SECONDS s" >> $OUT/info.txt
for m in 0 1; do
  echo "== VORTEX_NO_MMA_ATTENTION=$m" >> $OUT/decode.txt
  VORTEX_NO_MMA_ATTENTION=$m timeout 40 $B/vortex bench decode --device cuda --random-weights .gpu/qwen25-0.5b.json --batch 16 --context 8k --flows dense --kv-dtype fp8 --decode-tokens 32 >> $OUT/decode.txt 2>&1
done
echo "decode done $SECONDS s" >> $OUT/info.txt
