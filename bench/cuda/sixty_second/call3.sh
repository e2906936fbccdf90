#!/usr/bin/env bash
# Sixty-second pass, call 3: the generated cache phase a warp a page (and KV head): the suites
# that run generated flows on that build, then the generated cache phases' time (`cache us`,
# every page of the batch summarised) against `6a0da4c` (vortex_old), alternated twice.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins3.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
R=$OUT/r3; mkdir -p $R/suites
save() { echo "$1 rc=$2 $SECONDS s" >> $R/info.txt; tar czf $OUT/call3.tgz -C $OUT r3; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
timeout 200 $B/gpu_generated_flows > $R/suites/gpu_generated_flows.txt 2>&1 & a=$!
timeout 200 $B/gpu_flow_passes > $R/suites/gpu_flow_passes.txt 2>&1; save gpu_flow_passes $?
wait $a; save gpu_generated_flows $?
for t in gpu_model gpu_engine; do timeout 120 $B/$t > $R/suites/$t.txt 2>&1; save $t $?; done
F=crates/cuda/tests/flows
FL=lsh,double_sparse,$F/reductions.flow,$F/wide.flow,$F/halves_fp8.flow
for geo in "9 3 64" "32 8 128"; do
  set -- $geo
  for run in 1 2; do
    for v in vortex_old vortex; do
      timeout 90 $B/$v bench attention --device cuda --batch 16 --context 32k --budget 2k --iters 10 \
        --kv-dtype bf16 --heads-q $1 --heads-kv $2 --head-dim $3 --flows $FL \
        > $R/${v}_${2}x${3}_$run.txt 2>&1
      save "${v}_${2}x${3}_$run" $?
    done
  done
done
cd $R; cat info.txt; for f in suites/*.txt; do echo "$f: $(grep -h '^test result' $f | tail -1)"; done
for f in vortex*_1.txt; do echo "== $f"; grep "<- default" $f | grep -v "^ *16 " | awk '{print $1, $7, $9}'; done
