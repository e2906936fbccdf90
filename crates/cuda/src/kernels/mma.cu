// Warp-wide m16n8k16 tensor-core products with f32 accumulation (compute capability 8.0 or
// later), shared by the index kernels' scorers (scores.cu, double_sparse.cu) and the decode
// attention's page loop (attention_mma.cu).

// d += a b for one tile: a 16 x 16 bf16 (row), b 16 x 8 bf16 (col), d f32.
__device__ __forceinline__ void mma_bf16(float* d, unsigned int a0, unsigned int a1,
                                         unsigned int a2, unsigned int a3, unsigned int b0,
                                         unsigned int b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The same with f16 operands.
__device__ __forceinline__ void mma_f16(float* d, unsigned int a0, unsigned int a1,
                                        unsigned int a2, unsigned int a3, unsigned int b0,
                                        unsigned int b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
