#!/usr/bin/env bash
# A GPU server of random weights under `vortex bench serve`: 16 requests at once (closed loop),
# each a prompt of INPUT random token ids generating OUTPUT tokens. Writes OUT/serve_TAG.log and
# OUT/bench_TAG.json, TAG being GEOMETRY_FLOW_INPUT; extra arguments go to `bench serve`.
#
#   scripts/cuda_serve_bench.sh OUT GEOMETRY FLOW INPUT OUTPUT REQUESTS LIMIT_S [bench args...]
#   e.g. scripts/cuda_serve_bench.sh out qwen3-8b block_topk 8192 64 16 150 --budget 128
set -u
out=$1 geo=$2 flow=$3 input=$4 output=$5 n=$6 limit=$7
shift 7
vortex=${VORTEX:-target/release/vortex}
port=${PORT:-8100}
tag=${geo}_${flow}_${input}
log=$out/serve_$tag.log
mkdir -p "$out"
"$vortex" serve --device cuda --random-weights "$geo" --flow "$flow" --port "$port" \
  --max-running 16 --prefill-chunk "${PREFILL_CHUNK:-2048}" --quiet >"$log" 2>&1 &
server=$!
for _ in $(seq 1 360); do grep -q serving "$log" && break; sleep 0.5; done
grep serving "$log" || { cat "$log"; kill $server; exit 1; }
timeout "$limit" "$vortex" bench serve --url "http://127.0.0.1:$port" --concurrency 16 \
  --num-requests "$n" --input-len "$input" --output-len "$output" --json "$out/bench_$tag.json" "$@"
echo "bench exit $?"
kill $server
wait $server 2>/dev/null
