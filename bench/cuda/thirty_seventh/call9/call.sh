#!/usr/bin/env bash
# After review: measures in batches within a fixed scratch, taken when the server starts.
# gpu_page_mass (rows in several batches, rows past the recall's shared memory) with its speed
# test, gpu_engine; a block_topk server with --recall-every 16, mixed_ab.py at 8K.
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
timeout 100 ./gpu_page_mass --include-ignored --nocapture > $R/gpu_page_mass.txt 2>&1
echo "gpu_page_mass rc=$? $(grep -h '^test result' $R/gpu_page_mass.txt | tail -1)" >> $R/tests.txt
timeout 60 ./gpu_engine > $R/gpu_engine.txt 2>&1
echo "gpu_engine rc=$? $(grep -h '^test result' $R/gpu_engine.txt | tail -1)" >> $R/tests.txt
grep -E "^copy|^context|panicked" -A2 $R/gpu_page_mass.txt
cat $R/tests.txt
./vortex serve --device cuda --random-weights qwen3-1.7b --flow block_topk --flows quest,h2o --recall-every 16 --port 8011 > $R/serve_16.log 2>&1 &
S=$!
for i in $(seq 60); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 1; done
timeout 60 python3 mixed_ab.py http://127.0.0.1:8011 8192 512 mixed > $R/mixed.txt 2>&1
curl -s http://127.0.0.1:8011/metrics | grep -E "^vortex_selection|^vortex_generation_tokens" >> $R/mixed.txt
kill $S; wait $S
cat $R/mixed.txt; head -3 $R/serve_16.log
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
