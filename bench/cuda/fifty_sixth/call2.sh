#!/usr/bin/env bash
# Fifty-sixth pass, call 2: the CPU products' tests on the GPU host's Intel cores, which have
# AVX-VNNI as well as AVX-512 VNNI (every supported level, then capped at avxvnni), and the
# row-group products at the AVX-VNNI, AVX2 and AVX-512 levels.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
{ date -u; cat $B/rev; nproc; lscpu | grep -E "Model name"; grep -o -w 'avx_vnni\|avx512_vnni\|amx_int8\|avx512_bf16' /proc/cpuinfo | sort -u | tr '\n' ' '; echo; } > $OUT/info.txt
$B/quant > $OUT/quant_tests.txt 2>&1; echo "quant tests rc=$? $SECONDS s" >> $OUT/info.txt
VORTEX_MAX_ISA=avxvnni $B/quant > $OUT/quant_tests_avxvnni.txt 2>&1; echo "quant tests (avxvnni) rc=$? $SECONDS s" >> $OUT/info.txt
VORTEX_MAX_ISA=avxvnni $B/quant --ignored --nocapture kernel_rate_in_cache > $OUT/rate_avxvnni.txt 2>&1
for r in 1 2; do for t in 16 2; do
  echo "# round $r, RAYON_NUM_THREADS=$t: avx2 file layout"; VORTEX_MAX_ISA=avx2 RAYON_NUM_THREADS=$t $B/mm Q4_0,Q5_0,Q8_0,Q4_K,Q6_K 8960x1536,1536x1536 1,16,512
  for isa in avx2 avxvnni avx512; do
    echo "# round $r, RAYON_NUM_THREADS=$t: $isa ROW_GROUPS=1"; ROW_GROUPS=1 VORTEX_MAX_ISA=$isa RAYON_NUM_THREADS=$t $B/mm Q4_0,Q5_0,Q8_0,Q4_K,Q6_K 8960x1536,1536x1536 1,16,512
  done
done; done > $OUT/products.txt 2>&1
echo "products done $SECONDS s" >> $OUT/info.txt
