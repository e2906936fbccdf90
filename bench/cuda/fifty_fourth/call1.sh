#!/usr/bin/env bash
# Fifty-fourth pass, call 1: every GPU suite on the session's build (d9fa6cb), then the dense
# decode step of `bench decode --device cuda` and the block_topk / quest steps of target (b).
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader; date -u; cat .gpu/rev; nproc; lscpu | grep -E "Model name" ; } > $OUT/info.txt
timeout 360 bash scripts/gpu_suites.sh run $B/suites /tmp/suites > /dev/null 2>&1
cp /tmp/suites/summary.txt $OUT/summary.txt
tar czf $OUT/suites.tgz -C /tmp suites
echo "suites done $SECONDS s" >> $OUT/info.txt
timeout 100 $B/vortex bench attention --device cuda --batch 16 --context 32k --budget 2k --flows dense,block_topk,block_topk_fp8,quest,quest_fp8 --iters 50 > $OUT/attention.txt 2>&1
echo "attention done $SECONDS s" >> $OUT/info.txt
