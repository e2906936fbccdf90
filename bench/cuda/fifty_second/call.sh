#!/usr/bin/env bash
# Fifty-second pass, call 1: every GPU suite on the session's HEAD, then targets (a) and (b) re-timed.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader; date -u; cat .gpu/rev; } > $OUT/info.txt
timeout 330 bash scripts/gpu_suites.sh run $B/suites /tmp/suites > /dev/null 2>&1
cp /tmp/suites/summary.txt $OUT/summary.txt
tar czf $OUT/suites.tgz -C /tmp suites
echo "suites done $SECONDS s" >> $OUT/info.txt
for L in 10 1; do
  echo "== launches-per-timing $L" >> $OUT/targets.txt
  timeout 60 $B/vortex bench attention --device cuda --batch 16 --budget 2k --iters 50 --context 32k --flows block_topk,block_topk_fp8,quest,quest_fp8 --launches-per-timing $L >> $OUT/targets.txt 2>&1
done
echo "targets done $SECONDS s" >> $OUT/info.txt
timeout 100 $B/vortex bench attention --device cuda --batch 16 --context 8k,32k,128k --budget 2k --flows block_topk --iters 30 --json-out $OUT/vortex.json > $OUT/attention.txt 2>&1
timeout 100 python3 scripts/sdpa_decode_bench.py --iters 50 --block-topk-context 32768 --json $OUT/sdpa.json --vortex $OUT/vortex.json > $OUT/sdpa.txt 2>&1
echo "sdpa done $SECONDS s" >> $OUT/info.txt
