#!/usr/bin/env bash
# Fifty-fifth pass, call 1: the CPU products' tests and timing on the GPU host's Intel cores
# (K-quant row groups), then every GPU suite on the session's build.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; nproc; lscpu | grep -E "Model name|L1d|L2|Flags" | sed 's/Flags:.*\(avx512_vnni\).*/Flags: ... avx512_vnni .../'; } > $OUT/info.txt
$B/quant > $OUT/quant_tests.txt 2>&1; echo "quant tests rc=$? $SECONDS s" >> $OUT/info.txt
for r in 1 2; do for t in 16 2; do
  echo "# round $r, RAYON_NUM_THREADS=$t: file layout"; RAYON_NUM_THREADS=$t $B/mm Q4_K,Q6_K 8960x1536,1536x8960,1536x1536 1,16,512
  echo "# round $r, RAYON_NUM_THREADS=$t: ROW_GROUPS=1"; ROW_GROUPS=1 RAYON_NUM_THREADS=$t $B/mm Q4_K,Q6_K 8960x1536,1536x8960,1536x1536 1,16,512
done; done > $OUT/products.txt 2>&1
echo "products done $SECONDS s" >> $OUT/info.txt
timeout 360 bash scripts/gpu_suites.sh run $B/suites /tmp/suites > /dev/null 2>&1
cp /tmp/suites/summary.txt $OUT/summary.txt
tar czf $OUT/suites.tgz -C /tmp suites
echo "suites done $SECONDS s" >> $OUT/info.txt
