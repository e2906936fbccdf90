#!/usr/bin/env bash
# Fifty-sixth pass, call 1: the CPU products' tests on the GPU host's cores (row groups with
# AVX-512 VNNI and capped at AVX2), their timing at both levels, every GPU suite, then target
# (b)'s steps at 32K.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; nproc; lscpu | grep -E "Model name"; grep -o -w 'avx_vnni\|avx512_vnni\|amx_int8\|avx512_bf16' /proc/cpuinfo | sort -u | tr '\n' ' '; echo; } > $OUT/info.txt
$B/quant > $OUT/quant_tests.txt 2>&1; echo "quant tests rc=$? $SECONDS s" >> $OUT/info.txt
VORTEX_MAX_ISA=avx2 $B/quant > $OUT/quant_tests_avx2.txt 2>&1; echo "quant tests (avx2) rc=$? $SECONDS s" >> $OUT/info.txt
for r in 1; do for isa in avx512 avx2; do for t in 16 2; do
  echo "# round $r, $isa, RAYON_NUM_THREADS=$t: file layout"; VORTEX_MAX_ISA=$isa RAYON_NUM_THREADS=$t $B/mm Q4_0,Q5_0,Q8_0,Q4_K,Q6_K 8960x1536,1536x1536 1,16,512
  echo "# round $r, $isa, RAYON_NUM_THREADS=$t: ROW_GROUPS=1"; ROW_GROUPS=1 VORTEX_MAX_ISA=$isa RAYON_NUM_THREADS=$t $B/mm Q4_0,Q5_0,Q8_0,Q4_K,Q6_K 8960x1536,1536x1536 1,16,512
done; done; done > $OUT/products.txt 2>&1
echo "products done $SECONDS s" >> $OUT/info.txt
timeout 380 bash scripts/gpu_suites.sh run $B /tmp/suites > /dev/null 2>&1
cp /tmp/suites/summary.txt $OUT/summary.txt
tar czf $OUT/suites.tgz -C /tmp suites
echo "suites done $SECONDS s" >> $OUT/info.txt
for L in 10; do
  $B/vortex bench attention --device cuda --batch 16 --budget 2k --iters 50 --context 32k --flows block_topk,block_topk_fp8,quest,quest_fp8 --launches-per-timing $L > $OUT/attention_L$L.txt 2>&1
done
echo "bench done $SECONDS s" >> $OUT/info.txt
