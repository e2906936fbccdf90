#!/usr/bin/env bash
# Call 2: each kernel's own duration in Gemma 3 270M's decode step (ncu, one metric).
set -u
B=/tmp/bins
export VORTEX_KERNEL_CACHE=/tmp/kcache
which ncu > $OUT/ncu_info.txt 2>&1; ncu --version >> $OUT/ncu_info.txt 2>&1
timeout 280 ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base --launch-count 3000 \
  $B/vortex bench decode --device cuda --random-weights gemma3-270m --batch 16 --context 8k --decode-tokens 4 --flows dense > $OUT/ncu_dense.csv 2> $OUT/ncu_err.txt
echo "ncu rc=$?" >> $OUT/ncu_info.txt
gzip $OUT/ncu_dense.csv
