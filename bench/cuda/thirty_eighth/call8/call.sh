#!/usr/bin/env bash
# The recall kernel with hashed kept pages, bytes of the k-th mass and ties ranked by the block:
# a block_topk server (quest and h2o beside) without --recall-every and with 16, mixed_ab.py
# at 32K-token prompts against each, its /metrics after.
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
for every in none 16; do
  flag=""; [ $every != none ] && flag="--recall-every $every"
  ./vortex serve --device cuda --random-weights qwen3-1.7b --flow block_topk --flows quest,h2o $flag --port 8011 > $R/serve_$every.log 2>&1 &
  S=$!
  for i in $(seq 90); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 1; done
  echo "recall-every $every" >> $R/mixed.txt
  timeout 110 python3 mixed_ab.py http://127.0.0.1:8011 32768 512 mixed >> $R/mixed.txt 2>&1
  curl -s http://127.0.0.1:8011/metrics | grep -E "^vortex_selection|^vortex_generation_tokens" >> $R/mixed.txt
  kill $S; wait $S
done
cat $R/mixed.txt
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
