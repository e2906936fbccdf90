#!/usr/bin/env bash
# Sixty-second pass, call 2: the generated index phases read the query again for a page's later
# values (`READ_SHARED_AGAIN`): the generated-flow suites on that build, then the changed test
# flows against `c71a8a9` (vortex_old), alternated twice, at three geometries.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins2.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
R=$OUT/r2; mkdir -p $R/suites
save() { echo "$1 rc=$2 $SECONDS s" >> $R/info.txt; tar czf $OUT/call2.tgz -C $OUT r2; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
for t in gpu_generated_flows gpu_flow_passes; do
  timeout 200 $B/$t > $R/suites/$t.txt 2>&1; save $t $?
done
F=crates/cuda/tests/flows
FL=$F/reductions.flow,$F/wide.flow,$F/halves_fp8.flow
for geo in "9 3 64" "14 2 64" "32 8 128"; do
  set -- $geo
  for run in 1 2; do
    for v in vortex_old vortex; do
      timeout 90 $B/$v bench attention --device cuda --batch 1,16 --context 32k --budget 2k --iters 20 \
        --launches-per-timing 10 --kv-dtype bf16 --heads-q $1 --heads-kv $2 --head-dim $3 --flows $FL \
        > $R/${v}_${2}x${3}_$run.txt 2>&1
      save "${v}_${2}x${3}_$run" $?
    done
  done
done
cd $R; cat info.txt; tail -3 suites/*.txt; for f in vortex*_1.txt; do echo "== $f"; grep -v "^$" $f | tail -14; done
