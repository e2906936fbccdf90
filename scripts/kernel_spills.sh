#!/usr/bin/env bash
# Which decode-path kernels spill registers, for the model geometries (or those given as
# KV_HEADS:HEAD_DIM:PAGE:GROUP), compiled for sm_90 here, without a GPU: NVRTC and ptxas 12.9
# from PyPI wheels (cached in ~/.cache/vortex/nvwheels; about 130 MB). The GPU machines compile
# with their own NVRTC, whose allocation may differ slightly.
#
#   scripts/kernel_spills.sh [KV_HEADS:HEAD_DIM:PAGE:GROUP ...]
set -eu
cache=${XDG_CACHE_HOME:-$HOME/.cache}/vortex/nvwheels
version=12.9.86
if [ ! -x "$cache/nvidia/cuda_nvcc/bin/ptxas" ] || [ ! -f "$cache/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" ]; then
  mkdir -p "$cache"
  pip download --quiet --no-deps -d "$cache/wheels" \
    "nvidia-cuda-nvcc-cu12==$version" "nvidia-cuda-nvrtc-cu12==$version"
  for w in "$cache"/wheels/*.whl; do python3 -m zipfile -e "$w" "$cache"; done
  chmod +x "$cache/nvidia/cuda_nvcc/bin/ptxas"
fi
texts=$(mktemp -d)
trap 'rm -rf "$texts"' EXIT
cargo run --quiet --release -p vortex-cuda --example kernel_texts -- "$texts" "$@"
export KERNEL_SPILLS_REPORT=$(cd "$(dirname "$0")" && pwd)/ptxas_report.py
report() {
  python3 "$KERNEL_SPILLS_REPORT" "$1/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" \
    "$1/nvidia/cuda_nvcc/bin/ptxas" "$2" | sed "s|^|$(basename "$2" .cu) |"
}
export -f report
ls "$texts"/*.cu | xargs -P "$(nproc)" -I{} bash -c 'report "$0" "$1"' "$cache" {} |
  awk '$8 > 0' | sort
