#!/bin/bash
# Random Qwen3-0.6B weights (f32 on the CPU) as loaded, against quantized to Q8_0 at load;
# three rounds alternated.
for r in 1 2 3; do
  for w in bf16 q8_0; do
    echo "## round $r --weight-dtype $w"
    target/release/vortex bench decode --random-weights qwen3-0.6b --context 512,2k --flows dense --decode-tokens 16 --weight-dtype $w 2>&1 | grep -E "weights|dense|resident"
  done
done
