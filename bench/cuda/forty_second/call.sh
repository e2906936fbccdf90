#!/usr/bin/env bash
# Forty-second pass. call.sh suites | bench
cd "$(dirname "$0")" && tar xJf bins.tar.xz
R=$OUT
export VORTEX_KERNEL_CACHE=$PWD/kcache
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
case "$1" in
suites)
  timeout 540 ./gpu_suites.sh run . $R/suites
  cat $R/machine.txt $R/suites/summary.txt
  mkdir -p $R/failed; for f in $R/suites/*.txt; do grep -q "FAILED\|panicked" $f && cp $f $R/failed/; done
  cd $R && tar czf suites.tgz suites && rm -rf suites ;;
bench)
  A="./vortex bench attention --device cuda --batch 16 --budget 2k --iters 50"
  { $A --context 8k,32k,128k --flows dense > $R/dense.txt 2>&1; } 
  $A --context 32k --flows block_topk,block_topk_fp8,quest,quest_fp8 --launches-per-timing 10 --json-out $R/sparse10.json > $R/sparse10.txt 2>&1
  $A --context 32k --flows block_topk,block_topk_fp8,quest,quest_fp8 > $R/sparse1.txt 2>&1
  timeout 120 ./gpu_topk --ignored gpu_topk_speed --nocapture > $R/topk_speed.txt 2>&1
  D="./vortex bench decode --device cuda --batch 16 --context 32k --decode-tokens 32 --budget 2k --settle-ms 1000 --ahead"
  timeout 200 $D --random-weights qwen3-8b --weight-dtype fp8 --flows dense,block_topk,block_topk_fp8,quest_fp8 > $R/decode8b.txt 2>&1
  timeout 120 $D --random-weights qwen3-1.7b --flows dense,block_topk > $R/decode17b.txt 2>&1
  cd $R; for f in *.txt; do echo "== $f"; grep -v "^$" $f | tail -25; done ;;
prompt)
  for t in gpu_engine gpu_model gpu_logprobs; do timeout 120 ./$t --nocapture > $R/$t.txt 2>&1; echo "$t rc=$? $(grep '^test result' $R/$t.txt)"; done
  grep -E "^test .*(FAILED|ok)$" $R/gpu_engine.txt | head -20
  grep -hE "largest log-probability|FAILED|panicked" $R/gpu_model.txt $R/gpu_engine.txt | head -20
  for w in ${WEIGHTS:-bf16}; do
    ./vortex serve --device cuda --random-weights qwen3-8b --weight-dtype $w --port 8097 --quiet > $R/server_$w.log 2>&1 &
    pid=$!
    timeout 240 python3 prompt_scores.py http://127.0.0.1:8097 > $R/prompt_scores_$w.txt 2>&1
    kill $pid; wait $pid
    echo "== $w"; cat $R/prompt_scores_$w.txt; tail -3 $R/server_$w.log
  done
  if [ -n "${SDPA:-}" ]; then
    ./vortex bench attention --device cuda --batch 16 --context 8k,32k,128k --budget 2k --flows block_topk,block_topk_fp8,quest,quest_fp8 --iters 50 --json-out $R/vortex.json > $R/attention.txt 2>&1
    timeout 200 python3 ../scripts/sdpa_decode_bench.py --iters 50 --block-topk-context 32768 --json $R/sdpa.json --vortex $R/vortex.json > $R/sdpa.txt 2>&1
    tail -30 $R/sdpa.txt
  fi ;;
esac
