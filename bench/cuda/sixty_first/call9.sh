#!/usr/bin/env bash
# Sixty-first pass, call 9: call 8's gpu_model failed once (the pool's memory share off by the
# 373 MB a model dropped before had left in the device's memory pool). With free memory read
# after the context's synchronisation and a trim of that pool: gpu_model three times, then
# gpu_engine, on the commit in `rev`.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache RUST_TEST_NOCAPTURE=1
R=$OUT/r9; mkdir -p $R
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
for i in 1 2 3; do
  timeout 80 $B/gpu_model > $R/gpu_model_$i.txt 2>&1
  echo "gpu_model $i rc=$? $SECONDS s" >> $R/info.txt
done
timeout 60 $B/gpu_engine > $R/gpu_engine.txt 2>&1
echo "gpu_engine rc=$? $SECONDS s" >> $R/info.txt
tar czf $OUT/call9.tgz -C $OUT r9
cat $R/info.txt; grep -h "test result\|bytes free of" $R/*.txt
