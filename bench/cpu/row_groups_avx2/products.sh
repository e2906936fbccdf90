#!/bin/bash
# Single products at the AVX2 level (VORTEX_MAX_ISA=avx2): the file layout against row groups,
# two rounds alternated; bench/cpu/row_groups/mm.rs copied to crates/kernels/examples/mm.rs.
for r in 1 2; do
  echo "# round $r: file layout"
  VORTEX_MAX_ISA=avx2 target/release/examples/mm Q4_0,Q4_1,Q5_0,Q8_0,Q4_K,Q6_K 1536x1536,8960x1536 1,16,512
  echo "# round $r: ROW_GROUPS=1"
  ROW_GROUPS=1 VORTEX_MAX_ISA=avx2 target/release/examples/mm Q4_0,Q4_1,Q5_0,Q8_0,Q4_K,Q6_K 1536x1536,8960x1536 1,16,512
done
for r in 1 2; do
  VORTEX_MAX_ISA=avx2 cargo test --release -p vortex-kernels --test quant matmul_bandwidth -- --ignored --nocapture 2>&1 | grep -v "^$\|Finished\|Running\|running"
done
