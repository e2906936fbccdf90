#!/usr/bin/env bash
# Scratch build: page_mass_part with at most VORTEX_PM_LANES lanes a token (32: the build's
# 16 for head_dim 128; 8, 4, 2: fewer shuffles a token, more loads a lane): gpu_page_mass and
# its speed test for each.
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
for lanes in 32 8 4 2 32 8 4; do
  VORTEX_PM_LANES=$lanes timeout 100 ./gpu_page_mass --include-ignored --nocapture > $R/lanes_$lanes.txt 2>&1
  echo "lanes $lanes rc=$? $(grep -h '^test result' $R/lanes_$lanes.txt | tail -1)" >> $R/tests.txt
  grep -E "^context" $R/lanes_$lanes.txt | sed "s/^/lanes $lanes: /" >> $R/tests.txt
done
cat $R/tests.txt
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
