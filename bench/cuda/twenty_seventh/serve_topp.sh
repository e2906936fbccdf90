#!/usr/bin/env bash
# Serve A/B for top-p sampling: drawn on the device, or (a zero logit bias) on the host.
out=${1:?OUT}
dir=$(cd "$(dirname "$0")" && pwd)
"$dir/vortex" serve --device cuda --random-weights qwen3-1.7b --weight-dtype fp8 --flow block_topk \
  --max-running 16 --port 8011 --quiet > "$out/server_topp.log" 2>&1 &
pid=$!
for i in $(seq 1 120); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 0.5; done
for round in 1 2; do
for mode in device host; do
  body='{"temperature":0.7,"top_p":0.9}'
  [ "$mode" = host ] && body='{"temperature":0.7,"top_p":0.9,"logit_bias":{"0":0}}'
  "$dir/vortex" bench serve --url http://127.0.0.1:8011 --concurrency 16 --num-requests 32 \
    --input-len 1k --output-len 512 --extra-body "$body" --json "$out/topp_${mode}_$round.json" \
    > "$out/topp_${mode}_$round.txt" 2>&1
  echo "== $mode round $round"; grep -E "^conc=16 " "$out/topp_${mode}_$round.txt"
done
done
curl -s http://127.0.0.1:8011/metrics | grep -E '^vortex_decode|^vortex_generation'
kill $pid; wait $pid 2>/dev/null
