#!/usr/bin/env bash
# Fifty-seventh pass, call 1: decode attention on bf16 pairs on the GPU host's cores (the CPU
# attention tests, capped and not; the CPU bench at both caps), every GPU suite (their CPU
# references now run the pairs where a bf16 pool meets AVX-512 BF16), then target (b)'s steps.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; nproc; lscpu | grep -E "Model name"; grep -o -w 'avx512_bf16\|avx512_vnni\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' '; echo; } > $OUT/info.txt
$B/attention_cpu > $OUT/attention_cpu.txt 2>&1; echo "cpu attention tests rc=$? $SECONDS s" >> $OUT/info.txt
VORTEX_MAX_ISA=avx512 $B/attention_cpu > $OUT/attention_cpu_avx512.txt 2>&1; echo "cpu attention tests (avx512) rc=$? $SECONDS s" >> $OUT/info.txt
timeout 380 bash scripts/gpu_suites.sh run $B /tmp/suites > /dev/null 2>&1
cp /tmp/suites/summary.txt $OUT/summary.txt
tar czf $OUT/suites.tgz -C /tmp suites
echo "suites done $SECONDS s" >> $OUT/info.txt
for r in 1 2; do for isa in avx512 avx512bf16; do for t in 16 2; do
  echo "# round $r, VORTEX_MAX_ISA=$isa, --threads $t"
  VORTEX_MAX_ISA=$isa timeout 60 $B/vortex bench attention --threads $t --batch 4 --context 32k --kv-dtype bf16 --flows block_topk --iters 7 2>&1 | tail -3
done; done; done > $OUT/cpu_attention.txt 2>&1
echo "cpu bench done $SECONDS s" >> $OUT/info.txt
$B/vortex bench attention --device cuda --batch 16 --budget 2k --iters 50 --context 32k --flows block_topk,block_topk_fp8,quest,quest_fp8 --launches-per-timing 10 > $OUT/attention_L10.txt 2>&1
echo "bench done $SECONDS s" >> $OUT/info.txt
