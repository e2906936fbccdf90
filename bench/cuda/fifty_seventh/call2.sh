#!/usr/bin/env bash
# Fifty-seventh pass, call 2: gpu_attention with its CPU reference over the pool's values in
# f32; decode and prefill attention on bf16 pairs against the f32 products on the GPU host's
# Intel cores (caps alternated, two rounds, 1 to 16 threads).
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; nproc; lscpu | grep -E "Model name|MHz"; } > $OUT/info.txt
$B/gpu_attention > $OUT/gpu_attention.txt 2>&1; echo "gpu_attention rc=$? $SECONDS s" >> $OUT/info.txt
for r in 1 2; do for t in 1 2 8 16; do for isa in avx512 avx512bf16; do
  echo "# round $r, VORTEX_MAX_ISA=$isa, --threads $t"
  VORTEX_MAX_ISA=$isa timeout 60 $B/vortex bench attention --threads $t --batch 4 --context 32k --kv-dtype bf16 --flows block_topk --iters 7 2>&1 | tail -2
done; done; done > $OUT/cpu_decode_attention.txt 2>&1
echo "cpu decode bench done $SECONDS s" >> $OUT/info.txt
for r in 1 2; do for isa in avx512 avx512bf16; do
  echo "# round $r, VORTEX_MAX_ISA=$isa"
  VORTEX_MAX_ISA=$isa RAYON_NUM_THREADS=16 timeout 100 $B/prefill_cpu --ignored prefill_speed --nocapture 2>&1 | grep -v "^$"
done; done > $OUT/cpu_prefill.txt 2>&1
echo "cpu prefill bench done $SECONDS s" >> $OUT/info.txt
