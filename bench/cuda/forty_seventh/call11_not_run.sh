#!/usr/bin/env bash
# Not run: the session's device time could not start another machine.
# Call 11: the prefetching build also where the chunked one spills: which build each geometry's
# step chooses ("<- default"), and the suites that run model steps.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/info.txt
timeout 60 $B/vortex bench attention --device cuda --heads-q 14 --heads-kv 2 --head-dim 64 --batch 16 --context 2k,8k,32k --flows dense --iters 30 > $OUT/att.txt 2>&1
timeout 60 $B/vortex bench attention --device cuda --batch 16 --context 8k,32k --flows dense --iters 30 >> $OUT/att.txt 2>&1
for t in gpu_model gpu_engine; do t0=$SECONDS; timeout 100 $B/$t > $OUT/$t.txt 2>&1; echo "$t rc=$? $((SECONDS-t0))s $(grep -h '^test result' $OUT/$t.txt | tail -1)" >> $OUT/info.txt; done
