#!/usr/bin/env bash
# The build before (vortex_old, 99c7ac4) against this one, alternated: the decode step of
# Qwen3-1.7B's shape (bench decode), then 16 plain block_topk requests served.
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
for b in old new old new; do
  bin=./vortex; [ $b = old ] && bin=./vortex_old
  timeout 100 $bin bench decode --device cuda --random-weights qwen3-1.7b --batch 16 --context 32k --decode-tokens 32 --flows dense,block_topk --budget 2k >> $R/bench_decode_$b.txt 2>&1
done
for b in old new old new; do
  bin=./vortex; [ $b = old ] && bin=./vortex_old
  $bin serve --device cuda --random-weights qwen3-1.7b --flow block_topk --port 8011 > $R/serve_$b.log 2>&1 &
  S=$!
  for i in $(seq 90); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 1; done
  echo $b >> $R/plain.txt
  timeout 80 python3 own_settings.py http://127.0.0.1:8011 8192 128 plain >> $R/plain.txt 2>&1
  kill $S; wait $S
done
cat $R/plain.txt; for b in old new; do echo $b; grep -v "^ *$" $R/bench_decode_$b.txt | tail -8; done
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
