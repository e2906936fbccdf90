#!/usr/bin/env bash
# Refused requests: gpu_engine, then a server with --flows quest,h2o answering requests of
# those flows, with their own dense layers, and refusing block_topk_fp8 (no memory left for
# its summaries) with a 400, twice, streamed and not.
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
timeout 150 ./gpu_engine > $R/gpu_engine.txt 2>&1; echo "gpu_engine rc=$? $(grep -h '^test result' $R/gpu_engine.txt | tail -1)" >> $R/tests.txt
cat $R/tests.txt
./vortex serve --device cuda --random-weights qwen3-1.7b --flow block_topk --flows quest,h2o --port 8011 > $R/serve.log 2>&1 &
S=$!
for i in $(seq 90); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 1; done
for v in '{"flow": "quest"}' '{"flow": "h2o", "dense_layers": [0, 1]}' '{"dense_layers": [3], "tolerance": 0.2}' '{"flow": "block_topk_fp8"}' '{"flow": "block_topk_fp8"}'; do
  curl -s http://127.0.0.1:8011/v1/completions -H 'content-type: application/json' \
    -d "{\"prompt\": \"hi\", \"max_tokens\": 4, \"vortex\": $v}" -w "\n$v HTTP %{http_code}\n" >> $R/requests.txt 2>&1
done
curl -sN http://127.0.0.1:8011/v1/completions -H 'content-type: application/json' \
  -d '{"prompt": "hi", "max_tokens": 4, "stream": true, "vortex": {"flow": "block_topk_fp8"}}' -w "\nstreamed HTTP %{http_code}\n" >> $R/requests.txt 2>&1
kill $S; wait $S
cat $R/requests.txt; head -2 $R/serve.log; tail -8 $R/serve.log
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
