#!/usr/bin/env bash
# Page masses scored on the tensor cores (mma_keys.cu, shared with the attention's page loop):
# gpu_page_mass with its speed test, new and old builds alternated twice; dense attention
# whose page loop now takes its scores from mma_keys.cu (fp8 pool, group 4; bf16 pool, group 8),
# old and new alternated twice; the resource use of the cached kernels; gpu_attention.
cd "$(dirname "$0")" && tar xJf bins.tar.xz
R=$OUT/r; mkdir -p $R
export VORTEX_KERNEL_CACHE=$PWD/kcache
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
timeout 100 ./gpu_page_mass --include-ignored --nocapture > $R/gpu_page_mass.txt 2>&1
echo "gpu_page_mass rc=$? $(grep -h '^test result' $R/gpu_page_mass.txt | tail -1)" >> $R/tests.txt
for i in 1 2; do
  for b in gpu_page_mass gpu_page_mass_old; do
    echo "== $b run $i" >> $R/mass_ab.txt
    timeout 60 ./$b --ignored page_mass_speed --nocapture 2>&1 | grep -E "^context" >> $R/mass_ab.txt
  done
done
cat $R/mass_ab.txt
for i in 1 2; do
  for b in vortex vortex_old; do
    echo "== $b run $i" >> $R/attn_ab.txt
    timeout 60 ./$b bench attention --device cuda --batch 16 --context 32k --flows dense --kv-dtype fp8 --iters 50 2>&1 | grep -E "default|flow batch|dense" >> $R/attn_ab.txt
    timeout 60 ./$b bench attention --device cuda --batch 16 --context 32k --heads-q 64 --heads-kv 8 --flows dense --iters 50 2>&1 | grep -E "default|flow batch|dense" >> $R/attn_ab.txt
  done
done
cat $R/attn_ab.txt
for f in kcache/*.cubin; do cuobjdump -res-usage $f 2>/dev/null | grep -A1 "page_mass_part\|Function paged_decode\b" ; done > $R/res_usage.txt
timeout 240 ./gpu_attention > $R/gpu_attention.txt 2>&1
echo "gpu_attention rc=$? $(grep -h '^test result' $R/gpu_attention.txt | tail -1)" >> $R/tests.txt
cat $R/tests.txt
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
