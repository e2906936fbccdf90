#!/usr/bin/env bash
# Session 50, call 1: the model's step with the committed plan rule (vortex) against one block
# a multiprocessor (vortex_1b); generated index phases before (vortex) and after
# (vortex_unroll) the unroll patch; every GPU suite with both patches; then a second round of
# the two A/Bs.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/info.txt
d() { # bin model batch context kv
  echo "== $1 $2 batch $3 context $4 $5" >> $OUT/decode.txt
  timeout 60 $B/$1 bench decode --device cuda --random-weights $2 --batch $3 --context $4 --flows dense --kv-dtype $5 --decode-tokens 32 2>&1 | grep -E "^ +[0-9]+ +[0-9]+ dense|device ms|rror" >> $OUT/decode.txt
}
f() { # bin heads-q heads-kv head-dim
  echo "== $1 $2q/$3kv x $4" >> $OUT/flow.txt
  timeout 120 $B/$1 bench attention --device cuda --heads-q $2 --heads-kv $3 --head-dim $4 --batch 16 --context 8k,32k --budget 2k --flows .gpu/block_topk_custom.flow,.gpu/block_topk_fp8_custom.flow,.gpu/quest_fp8_custom.flow --iters 20 >> $OUT/flow.txt 2>&1
}
round() {
  for kv in fp8 bf16; do for bc in "1 24k" "4 24k" "16 8k"; do set -- $bc
    for v in vortex vortex_1b; do d $v .gpu/qwen25-0.5b.json $1 $2 $kv; done
  done; done
  for kv in fp8 bf16; do for v in vortex vortex_1b; do d $v qwen3-1.7b 1 32k $kv; done; done
  echo "decode round $1 done $SECONDS s" >> $OUT/info.txt
  for v in vortex vortex_unroll; do f $v 32 8 128; f $v 14 2 64; done
  echo "flow round $1 done $SECONDS s" >> $OUT/info.txt
}
round 1
timeout 270 bash scripts/gpu_suites.sh run $B/suites /tmp/suites > /dev/null 2>&1
cp /tmp/suites/summary.txt $OUT/summary.txt
tar czf $OUT/suites.tgz -C /tmp suites
echo "suites done $SECONDS s" >> $OUT/info.txt
round 2
