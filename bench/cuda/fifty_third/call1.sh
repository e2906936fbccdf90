#!/usr/bin/env bash
# Fifty-third pass, call 1: every GPU suite on the session's build, `bench decode --device cuda`
# after the bench's flow-loading change, then CPU decode attention on the host's cores, the
# build before the batch-invariant CPU kernels (vortex_old) against this one, alternated.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader; date -u; cat .gpu/rev; nproc; lscpu | grep -E "Model name|Flags" | cut -c1-200; } > $OUT/info.txt
timeout 330 bash scripts/gpu_suites.sh run $B/suites /tmp/suites > /dev/null 2>&1
cp /tmp/suites/summary.txt $OUT/summary.txt
tar czf $OUT/suites.tgz -C /tmp suites
echo "suites done $SECONDS s" >> $OUT/info.txt
timeout 90 $B/vortex bench decode --device cuda --random-weights qwen3-1.7b --batch 16 --context 32k --decode-tokens 16 --flows dense,block_topk,quest_fp8 --budget 2k > $OUT/decode.txt 2>&1
echo "decode done $SECONDS s" >> $OUT/info.txt
for round in 1 2; do
  for bin in vortex_old vortex; do
    for cfg in "64 4k" "16 32k" "64 32k"; do
      set -- $cfg
      echo "== round $round $bin batch $1 context $2" >> $OUT/cpu.txt
      timeout 100 $B/$bin bench attention --batch $1 --context $2 --flows dense --kv-dtype bf16 --iters 9 --threads 16 >> $OUT/cpu.txt 2>&1
    done
  done
done
echo "cpu done $SECONDS s" >> $OUT/info.txt
