#!/usr/bin/env bash
# Fifty-eighth pass, call 1: bf16 weight products with and without bf16 pairs on the GPU host's
# Intel cores (correctness: the quant suite, which takes the pairs wherever the CPU has AVX-512
# BF16; speed: mm_isa at 16 and 2 threads), then every GPU suite, then target (b).
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; nproc; lscpu | grep -E "Model name|Flags" | sed 's/Flags:.*\(avx512_bf16\).*/Flags: ... \1 .../'; } > $OUT/info.txt
$B/quant_cpu > $OUT/quant_cpu.txt 2>&1; echo "cpu quant tests rc=$? $SECONDS s" >> $OUT/info.txt
for t in 16 2; do RAYON_NUM_THREADS=$t timeout 100 $B/mm_isa 8960x1536,1536x8960,4096x4096,12288x4096 1,16,512; done > $OUT/mm_isa.txt 2>&1
for t in 16; do for r in 1 2; do for isa in default avx2; do
  echo "# threads $t, round $r, VORTEX_MAX_ISA=$isa"
  if [ $isa = default ]; then unset VORTEX_MAX_ISA; else export VORTEX_MAX_ISA=$isa; fi
  RAYON_NUM_THREADS=$t timeout 60 $B/mm F16,F32 8960x1536,1536x8960,4096x4096 1,16,512
done; done; done > $OUT/mm_float.txt 2>&1
unset VORTEX_MAX_ISA
echo "mm_isa done $SECONDS s" >> $OUT/info.txt
timeout 300 bash scripts/gpu_suites.sh run $B /tmp/suites > /dev/null 2>&1
cp /tmp/suites/summary.txt $OUT/summary.txt
tar czf $OUT/suites.tgz -C /tmp suites
echo "suites done $SECONDS s" >> $OUT/info.txt
timeout 90 $B/vortex bench attention --device cuda --batch 16 --budget 2k --iters 50 --context 32k --flows block_topk,block_topk_fp8,quest,quest_fp8 --launches-per-timing 10 > $OUT/targets.txt 2>&1
echo "targets done $SECONDS s" >> $OUT/info.txt
