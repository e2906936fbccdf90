#!/usr/bin/env bash
# After review: gpu_engine, gpu_model, gpu_graphs and gpu_block_topk on the build with the
# memory check, the groups in table order and a flow that failed to load remembered; a server
# with --flows quest,h2o answers requests of those flows, and one not named there is refused
# twice with the reason.
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
for t in gpu_engine gpu_model; do
  timeout 150 ./$t > $R/$t.txt 2>&1; echo "$t rc=$? $(grep -h '^test result' $R/$t.txt | tail -1)" >> $R/tests.txt
done
cat $R/tests.txt
./vortex serve --device cuda --random-weights qwen3-1.7b --flow block_topk --flows quest,h2o --port 8011 > $R/serve.log 2>&1 &
S=$!
for i in $(seq 90); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 1; done
for f in quest h2o dense block_topk_fp8 block_topk_fp8; do
  curl -s http://127.0.0.1:8011/v1/completions -H 'content-type: application/json' \
    -d "{\"prompt\": \"hi\", \"max_tokens\": 4, \"vortex\": {\"flow\": \"$f\"}}" -w "\n$f HTTP %{http_code}\n" >> $R/requests.txt 2>&1
done
kill $S; wait $S
cat $R/requests.txt; head -2 $R/serve.log; tail -6 $R/serve.log
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
