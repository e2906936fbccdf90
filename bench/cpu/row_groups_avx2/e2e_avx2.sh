#!/bin/bash
# AVX2 level end to end, base (03c8686) against new, alternated.
for r in 1 2 3; do
 for m in qwen2.5-coder-1.5b qwen2.5-coder-0.5b smollm2-135m; do
  for b in base new; do
   echo "## round $r $m $b"
   VORTEX_MAX_ISA=avx2 /tmp/${b}_vortex bench decode --model $m --context 512 --flows dense --decode-tokens 16 2>&1 | grep -E "dense|bandwidth|resident"
  done
 done
done
