#!/usr/bin/env bash
# Serve A/B: decode ahead vs reading each step; writes serve_<mode>.json and .txt under $1.
out=${1:?OUT}
dir=$(cd "$(dirname "$0")" && pwd)
for mode in ahead read; do
  extra=""; [ "$mode" = read ] && extra="--no-decode-ahead"
  "$dir/vortex" serve --device cuda --random-weights qwen3-1.7b --weight-dtype fp8 --flow block_topk \
    --max-running 16 --port 8011 --quiet $extra > "$out/server_$mode.log" 2>&1 &
  pid=$!
  for i in $(seq 1 120); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 0.5; done
  "$dir/vortex" bench serve --url http://127.0.0.1:8011 --concurrency 16 --num-requests 48 \
    --input-len 8k --output-len 512 --extra-body '{"temperature":0}' --json "$out/serve_$mode.json" \
    > "$out/serve_$mode.txt" 2>&1
  curl -s http://127.0.0.1:8011/metrics | grep -E '^vortex_decode|^vortex_generation' >> "$out/serve_$mode.txt"
  kill $pid; wait $pid 2>/dev/null
  echo "== $mode"; cat "$out/serve_$mode.txt"
done
