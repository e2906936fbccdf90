#!/usr/bin/env bash
# Sampling kernel launch shapes: correctness and speed of each (threads a block, blocks a row).
dir=$(cd "$(dirname "$0")" && pwd)
for shape in "1024 8" "512 8" "256 8" "1024 4" "512 4" "1024 2" "1024 1" "512 1"; do
  set -- $shape
  echo "== threads $1 split $2"
  VORTEX_SAMPLE_THREADS=$1 VORTEX_SAMPLE_SPLIT=$2 "$dir/gpu_sampling_exp" 2>&1 | grep -E "^test result|panicked"
  VORTEX_SAMPLE_THREADS=$1 VORTEX_SAMPLE_SPLIT=$2 "$dir/gpu_sampling_exp" --ignored --nocapture gpu_sampling_speed 2>&1 | grep "^| [a-z]"
done
