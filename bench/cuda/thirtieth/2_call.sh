#!/bin/bash
# call 2: flows with large per-page values through the generated GPU kernels
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $OUT/2_machine.txt
for f in big_index big_cache; do
  echo "== bench attention $f" >> $OUT/2_big_values.txt
  timeout 120 ./vortex bench attention --device cuda --batch 4 --context 8k --budget 1k --flows flows/$f.flow --iters 5 >> $OUT/2_big_values.txt 2>&1
  echo "rc=$?" >> $OUT/2_big_values.txt
done
for f in big_index big_cache; do
  echo "== bench decode $f" >> $OUT/2_big_values.txt
  timeout 150 ./vortex bench decode --device cuda --random-weights qwen3-0.6b --flows dense,flows/$f.flow --batch 2 --context 4k --budget 1k --decode-tokens 4 >> $OUT/2_big_values.txt 2>&1
  echo "rc=$?" >> $OUT/2_big_values.txt
done
echo done
