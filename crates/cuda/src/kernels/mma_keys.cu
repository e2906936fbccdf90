// A page's keys as the B operand of score tiles S = Q K^T on the tensor cores (mma.cu's
// products), and a query head as their A operand: shared by the decode attention's page loop
// (attention_mma.cu) and the page masses (page_mass.cu). MMA_KEYS holds for PAGE_SIZE 16, at
// most 8 query heads per KV head, HEAD_DIM 64 or 128, and either an fp8 pool (compute capability
// 8.9 or later: the hardware widens e4m3 pairs to f16) or a bf16 pool (8.0 or later).
//
// S is 16 rows x 8 tokens, two tiles a page. Rows 0..7 of A are the query heads' parts (f16 or
// bf16), rows 8..15 their rests, so a lane's c0 + c2 is a score from the query to about 2^-22
// (f16) or 2^-16 (bf16). Lane (g, t) takes K's dims [D t, D t + D) of token g (and 8 + g), D =
// LANE_DIMS (HEAD_DIM / 4): the k index of chunk c (of MMA_CHUNKS, HEAD_DIM / 16) maps to dims
// D t + 4 c + {0, 1, 2, 3}, and Q is permuted alike.

#define KV_BYTES (KV_FP8 ? 1 : 2)
#if KV_FP8
#define MMA_ARCH 890
#else
#define MMA_ARCH 800
#endif
#if (HEAD_DIM == 128 || HEAD_DIM == 64) && PAGE_SIZE == 16 && GROUP <= 8 && \
    defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= MMA_ARCH
#define MMA_KEYS 1
#define LANE_DIMS (HEAD_DIM / 4)
#define MMA_CHUNKS (HEAD_DIM / 16)
#define MMA_FULL 0xffffffffu
#define MMA_NEG_INF (__int_as_float(0xff800000))
// 16-byte vectors of a token's row, and of the LANE_DIMS dims of K a lane takes.
#define ROW_V (HEAD_DIM * KV_BYTES / 16)
#define K_V (LANE_DIMS * KV_BYTES / 16)

#if KV_FP8
// Two f32 -> f16x2 (`lo` in the low half), rounded to nearest.
__device__ __forceinline__ unsigned int half2(float lo, float hi) {
    unsigned int r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float half_low(unsigned int r) {
    float f;
    asm("{.reg .b16 a, b;\n mov.b32 {a, b}, %1;\n cvt.f32.f16 %0, a;}" : "=f"(f) : "r"(r));
    return f;
}

__device__ __forceinline__ float half_high(unsigned int r) {
    float f;
    asm("{.reg .b16 a, b;\n mov.b32 {a, b}, %1;\n cvt.f32.f16 %0, b;}" : "=f"(f) : "r"(r));
    return f;
}
#define MMA_PAGE mma_f16
#else
// Two f32 -> bf16x2 (`lo` in the low half), rounded to nearest.
__device__ __forceinline__ unsigned int half2(float lo, float hi) {
    unsigned int r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float half_low(unsigned int r) { return __uint_as_float(r << 16); }

__device__ __forceinline__ float half_high(unsigned int r) {
    return __uint_as_float(r & 0xffff0000u);
}
#define MMA_PAGE mma_bf16
#endif

__device__ __forceinline__ unsigned int word(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// A page's K for lane (g, t): tokens g and 8 + g, dims [D t, D t + D), K_V vectors each, from
// the page's first vector `base`. Tokens past `valid` are zeros, so an unwritten slot can never
// put a NaN into the sums.
__device__ __forceinline__ void mma_load_keys(const uint4* __restrict__ kpool, size_t base, int g,
                                              int t, int valid, uint4* k) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int tok = 8 * i + g;
        const size_t o = base + tok * ROW_V + K_V * t;
#pragma unroll
        for (int j = 0; j < K_V; j++) k[K_V * i + j] = tok < valid ? __ldg(kpool + o + j) : zero;
    }
}

// The B operand of chunk c of the score tile of tokens 8 i + n: K dims D t + 4 c + {0, 1} and
// + {2, 3} of token 8 i + g.
__device__ __forceinline__ void key_operand(const uint4* k, int i, int c, unsigned int& b0,
                                            unsigned int& b1) {
#if KV_FP8
    const unsigned int kw = word(k[K_V * i + (c >> 2)], c & 3);
    b0 = e4m3x2_f16x2(kw);
    b1 = e4m3x2_f16x2(kw >> 16);
#else
    const uint4& v = k[K_V * i + (c >> 1)];
    b0 = word(v, 2 * (c & 1));
    b1 = word(v, 2 * (c & 1) + 1);
#endif
}

// The A operand of lane (g, t) from its query head's dims [D t, D t + D) at `qh` times
// `scale` (zeros where `head` is false: a row past the group): chunk c's parts and rests. With
// fp8 pages the query is first scaled by a power of two that puts the warp's largest near 2^14,
// well inside f16's range; the returned factor undoes it on the scores.
__device__ __forceinline__ float query_operand(const float* qh, bool head, float scale,
                                               unsigned int (*qa)[4]) {
    float x[LANE_DIMS];
#pragma unroll
    for (int i = 0; i < LANE_DIMS / 4; i++) {
        const float4 a = head ? *reinterpret_cast<const float4*>(qh + 4 * i)
                              : make_float4(0.f, 0.f, 0.f, 0.f);
        x[4 * i] = a.x * scale;
        x[4 * i + 1] = a.y * scale;
        x[4 * i + 2] = a.z * scale;
        x[4 * i + 3] = a.w * scale;
    }
    int e = 0;
#if KV_FP8
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < LANE_DIMS; i++) amax = fmaxf(amax, fabsf(x[i]));
    amax = __uint_as_float(__reduce_max_sync(MMA_FULL, __float_as_uint(amax)));
    if (amax > 0.f && amax <= 3.0e38f)
        e = min(100, max(-100, 14 - ((int)(__float_as_uint(amax) >> 23) - 127)));
#endif
    const float up = ldexpf(1.f, e);
#pragma unroll
    for (int c = 0; c < MMA_CHUNKS; c++) {
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const float x0 = x[4 * c + 2 * half] * up, x1 = x[4 * c + 2 * half + 1] * up;
            const unsigned int hi = half2(x0, x1);
            qa[c][2 * half] = hi;
            qa[c][2 * half + 1] = half2(x0 - half_low(hi), x1 - half_high(hi));
        }
    }
    return ldexpf(1.f, -e);
}

// Scores of one page's tokens 8 i + 2 t + {0, 1} (i = 0, 1) for lane (g, t)'s query head, as
// c0 + c2 of the two tiles, times `down`; tokens past `valid` score minus infinity.
__device__ __forceinline__ void mma_page_scores(const uint4* k, const unsigned int (*qa)[4],
                                                float down, int t, int valid, float (*s)[2]) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int c = 0; c < MMA_CHUNKS; c++) {
            unsigned int b0, b1;
            key_operand(k, i, c, b0, b1);
            MMA_PAGE(d, qa[c][0], qa[c][1], qa[c][2], qa[c][3], b0, b1);
        }
#pragma unroll
        for (int j = 0; j < 2; j++)
            s[i][j] = 8 * i + 2 * t + j < valid ? (d[j] + d[2 + j]) * down : MMA_NEG_INF;
    }
}
#else
#define MMA_KEYS 0
#endif
