#!/usr/bin/env bash
# Fifty-eighth pass, call 2 (call 1 trimmed to its CPU part): on the GPU host's Intel cores, the
# quant suite (bf16 pairs and the AVX-512 float tiles), bf16 products with and without the pairs
# (mm_isa, 16 and 2 threads), float products at AVX-512 against AVX2 (mm, 16 threads).
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; nproc; lscpu | grep -E "Model name"; grep -o -w -E "avx512_bf16|amx_bf16|avx512_fp16" /proc/cpuinfo | sort -u | tr '\n' ' '; echo; } > $OUT/info.txt
$B/quant_cpu > $OUT/quant_cpu.txt 2>&1; echo "cpu quant tests rc=$? $SECONDS s" >> $OUT/info.txt
for t in 16 2; do RAYON_NUM_THREADS=$t timeout 100 $B/mm_isa 8960x1536,1536x8960,4096x4096,12288x4096 16,512; done > $OUT/mm_isa.txt 2>&1
echo "mm_isa done $SECONDS s" >> $OUT/info.txt
for r in 1 2; do for isa in default avx2; do
  echo "# threads 16, round $r, VORTEX_MAX_ISA=$isa"
  if [ $isa = default ]; then unset VORTEX_MAX_ISA; else export VORTEX_MAX_ISA=$isa; fi
  RAYON_NUM_THREADS=16 timeout 60 $B/mm F16,F32,BF16 8960x1536,1536x8960,4096x4096 1,16,512
done; done > $OUT/mm_float.txt 2>&1
echo "mm done $SECONDS s" >> $OUT/info.txt
