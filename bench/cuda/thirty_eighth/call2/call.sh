#!/usr/bin/env bash
# quest_fp8's envelopes scored on the tensor cores (scores.cu, ENVELOPE): gpu_block_topk,
# gpu_h2o, gpu_model, gpu_graphs; the sparse attention steps at 32K (every hand-written flow,
# batch 16, budget 2K); Qwen3-8B and Qwen3-1.7B decode, fp8 weights, dense, quest and
# quest_fp8, settled and ahead.
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
for t in gpu_block_topk gpu_h2o gpu_model gpu_graphs; do
  timeout 200 ./$t > $R/$t.txt 2>&1; echo "$t rc=$? $(grep -h '^test result' $R/$t.txt | tail -1)" >> $R/tests.txt
done
cat $R/tests.txt
timeout 120 ./vortex bench attention --device cuda --batch 16 --context 32k --budget 2k --flows all --iters 50 > $R/attention.txt 2>&1
grep -E "default|flow batch" $R/attention.txt
for m in qwen3-8b qwen3-1.7b; do
  echo "== $m" >> $R/decode.txt
  timeout 150 ./vortex bench decode --device cuda --random-weights $m --batch 16 --context 32k --decode-tokens 32 --budget 2k --weight-dtype fp8 --flows dense,quest,quest_fp8 --settle-ms 1000 --ahead >> $R/decode.txt 2>&1
done
grep -E "==|32768|device ms" $R/decode.txt
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
