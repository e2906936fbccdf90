#!/usr/bin/env bash
# The final build: gpu_engine, gpu_model and gpu_graphs; mixed_flows.py against `vortex serve
# --device cuda --random-weights qwen3-1.7b --flow block_topk --flows quest,h2o` (dense chosen
# per request, loaded when first chosen); a flow not named in --flows whose summaries would
# pass the memory share is refused with the reason.
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
for t in gpu_engine gpu_model gpu_graphs; do
  timeout 150 ./$t > $R/$t.txt 2>&1; echo "$t rc=$? $(grep -h '^test result' $R/$t.txt | tail -1)" >> $R/tests.txt
done
cat $R/tests.txt
./vortex serve --device cuda --random-weights qwen3-1.7b --flow block_topk --flows quest,h2o --port 8011 > $R/serve.log 2>&1 &
S=$!
for i in $(seq 90); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 1; done
timeout 300 python3 mixed_flows.py http://127.0.0.1:8011 8192 128 > $R/mixed_flows.txt 2>&1
curl -s http://127.0.0.1:8011/v1/completions -H 'content-type: application/json' \
  -d '{"prompt": "hi", "max_tokens": 4, "vortex": {"flow": "block_topk_fp8"}}' -w '\nHTTP %{http_code}\n' > $R/not_loaded.txt 2>&1
curl -s http://127.0.0.1:8011/metrics | grep -E "flow_requests|kv_pages_(total|leaked)" > $R/metrics.txt
kill $S; wait $S
cat $R/mixed_flows.txt $R/not_loaded.txt $R/metrics.txt; head -2 $R/serve.log
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
