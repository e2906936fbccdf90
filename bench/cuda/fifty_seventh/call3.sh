#!/usr/bin/env bash
# Fifty-seventh pass, call 3: the final build. The CPU attention tests on the GPU host's Intel
# cores (bf16 pairs now off there), prefill attention's speed by default and capped at AVX-512
# (the same kernels now), then every GPU suite.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; nproc; lscpu | grep -E "Model name"; } > $OUT/info.txt
$B/attention_cpu > $OUT/attention_cpu.txt 2>&1; echo "cpu attention tests rc=$? $SECONDS s" >> $OUT/info.txt
$B/prefill_cpu > $OUT/prefill_cpu.txt 2>&1; echo "cpu prefill tests rc=$? $SECONDS s" >> $OUT/info.txt
for r in 1 2; do for isa in default avx512; do
  echo "# round $r, VORTEX_MAX_ISA=$isa"
  if [ $isa = default ]; then unset VORTEX_MAX_ISA; else export VORTEX_MAX_ISA=$isa; fi
  RAYON_NUM_THREADS=16 timeout 100 $B/prefill_cpu --ignored prefill_speed --nocapture 2>&1 | grep "|"
done; done > $OUT/cpu_prefill.txt 2>&1
unset VORTEX_MAX_ISA
echo "cpu prefill bench done $SECONDS s" >> $OUT/info.txt
timeout 400 bash scripts/gpu_suites.sh run $B /tmp/suites > /dev/null 2>&1
cp /tmp/suites/summary.txt $OUT/summary.txt
tar czf $OUT/suites.tgz -C /tmp suites
echo "suites done $SECONDS s" >> $OUT/info.txt
