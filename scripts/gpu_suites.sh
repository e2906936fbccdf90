#!/usr/bin/env bash
# Every GPU test suite of vortex-cuda, for a machine with a GPU and no Rust toolchain.
#
#   scripts/gpu_suites.sh pack DIR      here: builds the suites (release) and the vortex
#                                       binary, and copies them into DIR under plain names
#   scripts/gpu_suites.sh run DIR OUT   there: runs them, a log per suite in OUT and a summary
#                                       in OUT/summary.txt; exits non-zero if any failed
#
# `run` starts kernels_compile (NVRTC alone, CPU-bound: 41 s on an H100 host's 16 cores) in the
# background, runs the kernel suites at once beside it, then gpu_model and gpu_engine one at a
# time: gpu_model checks that the KV pool fills the memory share it is given, which a suite
# running beside it would disturb.
set -u
kernels="gpu_uploads gpu_page_mass gpu_sampling gpu_logprobs gpu_topk gpu_attention gpu_block_topk gpu_h2o gpu_generated_flows gpu_flow_passes gpu_prefill gpu_fp8_weights gpu_layer_kernels gpu_graphs"
alone="gpu_model gpu_engine"
case "${1:-}" in
pack)
  dir=${2:?usage: gpu_suites.sh pack DIR}
  mkdir -p "$dir"
  cargo build --release -p vortex || exit 1
  cp target/release/vortex "$dir/"
  cargo test --release -p vortex-cuda --no-run --message-format=json |
    python3 -c '
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("executable") and m["target"]["kind"] == ["test"]:
        shutil.copy(m["executable"], sys.argv[1] + "/" + m["target"]["name"])
' "$dir" || exit 1
  ls "$dir"
  ;;
run)
  dir=${2:?usage: gpu_suites.sh run DIR OUT} out=${3:?usage: gpu_suites.sh run DIR OUT}
  mkdir -p "$out"
  summary=$out/summary.txt
  { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || echo "no nvidia-smi"; } \
    >"$summary" 2>/dev/null
  suite() {
    local start=$SECONDS
    "$dir/$1" >"$out/$1.txt" 2>&1
    local rc=$?
    local skipped
    skipped=$(grep -c '^SKIPPED' "$out/$1.txt")
    echo "$1 rc=$rc $((SECONDS - start))s skipped=$skipped $(grep -h '^test result' "$out/$1.txt" | tail -1)" >>"$summary"
  }
  suite kernels_compile &
  compile=$!
  for t in $kernels; do suite "$t" & done
  wait $(jobs -p | grep -vx "$compile")
  for t in $alone; do suite "$t"; done
  wait "$compile"
  cat "$summary"
  ! grep -q "rc=[1-9]" "$summary"
  ;;
*)
  sed -n 2,8p "$0"
  exit 2
  ;;
esac
