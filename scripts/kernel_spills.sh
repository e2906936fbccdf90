#!/usr/bin/env bash
# Which decode-path kernels use local memory (spilled registers, or arrays kept there), for the
# model geometries or those given as KV_HEADS:HEAD_DIM:PAGE:GROUP (with the built-in flows' and
# any flow file's generated kernels), compiled for sm_90 here,
# without a GPU: NVRTC and ptxas 12.9 from PyPI wheels (cached in ~/.cache/vortex/nvwheels, about
# 130 MB). The GPU machines compile with their own NVRTC, whose allocation may differ slightly.
#
#   scripts/kernel_spills.sh [KV_HEADS:HEAD_DIM:PAGE:GROUP ...] [FLOW_FILE ...]
set -euo pipefail
here=$(cd -- "$(dirname -- "$0")" >/dev/null && pwd)
version=12.9.86
cache=${XDG_CACHE_HOME:-$HOME/.cache}/vortex/nvwheels/$version
nvrtc=$cache/nvidia/cuda_nvrtc/lib/libnvrtc.so.12
ptxas=$cache/nvidia/cuda_nvcc/bin/ptxas
if [ ! -x "$ptxas" ] || [ ! -f "$nvrtc" ]; then
  mkdir -p "$cache"
  python3 -m pip download --quiet --no-deps -d "$cache/wheels" \
    "nvidia-cuda-nvcc-cu12==$version" "nvidia-cuda-nvrtc-cu12==$version"
  for w in "$cache"/wheels/*.whl; do python3 -m zipfile -e "$w" "$cache"; done
  chmod +x "$ptxas"
fi
texts=$(mktemp -d)
trap 'rm -rf "$texts"' EXIT
cargo run --quiet --release --manifest-path "$here/../Cargo.toml" -p vortex-cuda \
  --example kernel_texts -- "$texts" "$@"
# One module a process, on every core; xargs fails if any module does (ptxas_report.py names it).
printf '%s\0' "$texts"/*.cu |
  xargs -0 -n 1 -P "$(nproc)" python3 "$here/ptxas_report.py" "$nvrtc" "$ptxas" |
  awk '$6 > 0 || $8 > 0' | sort
