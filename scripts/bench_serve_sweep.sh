#!/usr/bin/env bash
# Serving sweep for BENCHMARKS.md: one server, 4K-token prompts, Poisson arrivals at rising
# rates up to overload. At each rate every flow runs in turn (interleaved, so background load
# drifts alike for all) on the same workload: the same seed gives the same prompts and arrival
# times, and the server's prefix cache is off so no run reuses another's KV.
# Writes OUT/<flow>-<rate>.{json,txt,svg} and OUT/summary.md.
#
#   scripts/bench_serve_sweep.sh OUT [RATES] [REQUESTS]
set -euo pipefail
out=${1:?usage: bench_serve_sweep.sh OUT [RATES] [REQUESTS]}
rates=${2:-0.02,0.05,inf}
requests=${3:-6}
vortex=${VORTEX:-target/release/vortex}
port=${PORT:-8400}
flows=${FLOWS:-dense block_topk quest}
budget=${BUDGET:-64}
mkdir -p "$out"
"$vortex" serve --port "$port" --prefill-chunk 128 --max-running 32 --kv-memory 4GiB --no-prefix-cache \
  >"$out/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null' EXIT
until curl -sf "http://127.0.0.1:$port/health" >/dev/null; do sleep 0.5; done
seed=${SEED:-1}
for rate in ${rates//,/ }; do
  for flow in $flows; do
    args=(--flow "$flow")
    [ "$flow" != dense ] && args+=(--budget "$budget")
    "$vortex" bench serve --url "http://127.0.0.1:$port" --rate "$rate" \
      --num-requests "$requests" --input-len 4k --output-len 128 --seed "$seed" "${args[@]}" \
      --json "$out/$flow-$rate.json" --plot "$out/$flow-$rate.svg" >"$out/$flow-$rate.txt"
  done
done
curl -s "http://127.0.0.1:$port/metrics" >"$out/metrics.txt"
python3 "$(dirname "$0")/serve_summary.py" "$out" | tee "$out/summary.md"
