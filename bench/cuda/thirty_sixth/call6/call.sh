#!/usr/bin/env bash
# Index launches of a step's other flows on a second stream, beside the first flow's:
# gpu_model, gpu_engine, gpu_graphs, then mixed_ab.py against the build before (vortex_old,
# d4ef7b0) and this one, alternated twice.
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
for t in gpu_model gpu_engine gpu_graphs; do
  timeout 150 ./$t > $R/$t.txt 2>&1; echo "$t rc=$? $(grep -h '^test result' $R/$t.txt | tail -1)" >> $R/tests.txt
done
cat $R/tests.txt
for b in old new old new; do
  bin=./vortex; [ $b = old ] && bin=./vortex_old
  $bin serve --device cuda --random-weights qwen3-1.7b --flow block_topk --flows quest,h2o --port 8011 > $R/serve_$b.log 2>&1 &
  S=$!
  for i in $(seq 90); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 1; done
  echo $b >> $R/mixed.txt
  timeout 100 python3 mixed_ab.py http://127.0.0.1:8011 8192 128 >> $R/mixed.txt 2>&1
  kill $S; wait $S
done
cat $R/mixed.txt
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
