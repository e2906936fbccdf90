#!/usr/bin/env bash
# Serving sweep for BENCHMARKS.md: one server, 4K-token prompts, Poisson arrivals at rising
# rates up to overload, each flow in turn (a fresh seed per flow, so no flow finds another's
# prompts in the prefix cache). Writes OUT/<flow>.json, OUT/<flow>.svg and OUT/<flow>.txt.
#
#   scripts/bench_serve_sweep.sh OUT [RATES] [REQUESTS]
set -euo pipefail
out=${1:?usage: bench_serve_sweep.sh OUT [RATES] [REQUESTS]}
rates=${2:-0.02,0.05,inf}
requests=${3:-6}
vortex=${VORTEX:-target/release/vortex}
port=${PORT:-8400}
mkdir -p "$out"
"$vortex" serve --port "$port" --prefill-chunk 128 --max-running 32 --kv-memory 4GiB \
  >"$out/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null' EXIT
until curl -sf "http://127.0.0.1:$port/health" >/dev/null; do sleep 0.5; done
seed=1
for flow in dense block_topk quest; do
  args=()
  [ "$flow" != dense ] && args=(--flow "$flow" --budget 64)
  [ "$flow" = dense ] && args=(--flow dense)
  "$vortex" bench serve --url "http://127.0.0.1:$port" --rate "$rates" \
    --num-requests "$requests" --input-len 4k --output-len 128 --seed "$seed" "${args[@]}" \
    --json "$out/$flow.json" --plot "$out/$flow.svg" | tee "$out/$flow.txt"
  seed=$((seed + 1))
done
curl -s "http://127.0.0.1:$port/metrics" >"$out/metrics.txt"
