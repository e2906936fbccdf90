#!/usr/bin/env bash
# The final build (index kernels of a step with one flow set the ready flag of their block's row
# at once): every GPU suite, then `vortex bench attention` at 32K (block_topk, quest, h2o) on the
# build before (vortex_old, 6bac7a9) and this one alternated, then mixed_flows.py once more.
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
timeout 360 ./gpu_suites.sh run . $R/suites
for b in old new old new; do
  bin=./vortex; [ $b = old ] && bin=./vortex_old
  timeout 60 $bin bench attention --device cuda --batch 16 --context 32k --budget 2k --flows block_topk,quest,h2o --iters 50 >> $R/bench_attention_$b.txt 2>&1
done
for b in old new; do echo $b; grep -h "<- default" $R/bench_attention_$b.txt | grep -v "^ *16 "; done
./vortex serve --device cuda --random-weights qwen3-1.7b --flow block_topk --flows quest,h2o --port 8011 > $R/serve.log 2>&1 &
S=$!
for i in $(seq 90); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 1; done
timeout 150 python3 mixed_flows.py http://127.0.0.1:8011 8192 128 > $R/mixed_flows.txt 2>&1
kill $S; wait $S
cat $R/mixed_flows.txt
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
