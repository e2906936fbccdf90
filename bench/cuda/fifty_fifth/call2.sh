#!/usr/bin/env bash
# Fifty-fifth pass, call 2: the CPU products' tests and timing on the GPU host's Intel cores
# with every quantized format grouped, then gpu_model and gpu_engine (the GPU against the CPU).
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; nproc; lscpu | grep -E "Model name"; } > $OUT/info.txt
$B/quant > $OUT/quant_tests.txt 2>&1; echo "quant tests rc=$? $SECONDS s" >> $OUT/info.txt
for r in 1 2; do for t in 16 2; do
  echo "# round $r, RAYON_NUM_THREADS=$t: file layout"; RAYON_NUM_THREADS=$t $B/mm Q4_0,Q4_1,Q5_0,Q8_0 4864x896,896x4864,576x576 1,16,512
  echo "# round $r, RAYON_NUM_THREADS=$t: ROW_GROUPS=1"; ROW_GROUPS=1 RAYON_NUM_THREADS=$t $B/mm Q4_0,Q4_1,Q5_0,Q8_0 4864x896,896x4864,576x576 1,16,512
done; done > $OUT/products.txt 2>&1
echo "products done $SECONDS s" >> $OUT/info.txt
for s in gpu_model gpu_engine; do timeout 200 $B/suites/$s > $OUT/$s.txt 2>&1; echo "$s rc=$? $(grep -h '^test result' $OUT/$s.txt | tail -1)" >> $OUT/info.txt; done
echo "done $SECONDS s" >> $OUT/info.txt
