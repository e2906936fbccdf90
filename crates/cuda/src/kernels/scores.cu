// Centroid scores on the tensor cores, shared by the index kernels that score pages from a bf16
// centroid (block_topk.cu, h2o.cu; topk.cu and mma.cu are compiled in front). Defines:
// HEAD_DIM, GROUP.
// Centroids are [kv_head][pool page][HEAD_DIM] bf16, a row ROW_VEC 16-byte vectors.

#define ROW_VEC (HEAD_DIM / 8)
#if GROUP <= 8 && HEAD_DIM % 32 == 0 && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define MMA_CENTROIDS 1
#define CHUNKS (HEAD_DIM / 32)
#define LINES ((HEAD_DIM * 2 + 127) / 128)  // 128-byte lines of a centroid
// Up to 4 query heads, one n8 tile holds their bf16 parts (columns 0..3) and rests (4..7); up
// to 8, one tile holds the 8 parts and a second the 8 rests.
#define QTILES (GROUP <= 4 ? 1 : 2)
#else
#define MMA_CENTROIDS 0
#endif

#if MMA_CENTROIDS
// bf16 bits of x, rounded to nearest even (finite x).
__device__ __forceinline__ unsigned int bf16_bits(float x) {
    const unsigned int u = __float_as_uint(x);
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

// The bf16 words of (x[0], x[1]) and (x[2], x[3]): their bf16 parts, or (`rest`) what the parts
// leave, which together hold the f32 values to about 2^-16.
__device__ __forceinline__ void bf16_words(const float (&x)[4], bool rest, unsigned int& w0,
                                           unsigned int& w1) {
    unsigned int p[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const unsigned int hi = bf16_bits(x[j]);
        p[j] = rest ? bf16_bits(x[j] - __uint_as_float(hi << 16)) : hi;
    }
    w0 = p[0] | (p[1] << 16);
    w1 = p[2] | (p[3] << 16);
}

// A 16-byte load through the read-only path, emitted ahead of the products that use it (a
// volatile statement keeps its place in the generated code).
__device__ __forceinline__ uint4 ldg_v4(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// Asks L2 for the 128-byte line at p.
__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Centroid scores on the tensor cores: a warp takes 16 candidates at a time as the rows of
// m16n8k16 products whose columns are the group's queries, each split into its bf16 part and
// the bf16 rest (QTILES), so the f32 sums see the f32 query to about 2^-16. Both sides permute
// the dims alike (a lane loads 16 contiguous bytes of a centroid per 32 dims), which leaves
// each dot product as it was. Calls put(i, h, score) for candidate i < n and each query head
// h < GROUP (PER_HEAD), else put(i, 0, best score over the heads).
template <bool PER_HEAD, class Put>
__device__ __forceinline__ void mma_scores(const uint4* __restrict__ f0, size_t head_off,
                                           const unsigned int* __restrict__ cand, int n,
                                           const float* __restrict__ qrow, Put put) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3, hq = QTILES == 1 ? g & 3 : g;
    unsigned int qb[CHUNKS][2][QTILES][2];
#pragma unroll
    for (int c = 0; c < CHUNKS; c++)
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int k = 0; k < QTILES; k++) {
                // Column g of tile k: head hq's bf16 part, or its rest in columns 4..7 of the one
                // tile, or in the second tile.
                float x[4];
#pragma unroll
                for (int j = 0; j < 4; j++)
                    x[j] = hq < GROUP ? qrow[hq * HEAD_DIM + 32 * c + 8 * t + 4 * m + j] : 0.f;
                bf16_words(x, QTILES == 1 ? g >= 4 : k == 1, qb[c][m][k][0], qb[c][m][k][1]);
            }
    const int tiles = (n + 15) / 16;
    // A tile a step. While a tile's centroids load, the next tile's are fetched into L2 (no
    // registers held, so twice the bytes in flight) and the page ids of the one after load.
    unsigned int id[2], ahead[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int i = warp * 16 + g + 8 * h;
        id[h] = i < n ? cand[i] : 0u;
        ahead[h] = i + 16 * TK_WARPS < n ? cand[i + 16 * TK_WARPS] : 0u;
    }
    for (int tile = warp; tile < tiles; tile += TK_WARPS) {
        uint4 x[2][CHUNKS];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            // Rows past the candidates read page 0 and are never written.
            const uint4* row = f0 + head_off + (size_t)id[h] * ROW_VEC + t;
#pragma unroll
            for (int c = 0; c < CHUNKS; c++) x[h][c] = ldg_v4(row + 4 * c);
        }
#pragma unroll
        for (int li = t; li < 2 * LINES; li += 4) {
            const int h = li / LINES;
            const unsigned int page = h ? ahead[1] : ahead[0];
            if ((tile + TK_WARPS) * 16 + g + 8 * h < n)
                prefetch_l2(reinterpret_cast<const char*>(f0 + head_off + (size_t)page * ROW_VEC) +
                            128 * (li % LINES));
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            id[h] = ahead[h];
            const int i = (tile + 2 * TK_WARPS) * 16 + g + 8 * h;
            ahead[h] = i < n ? cand[i] : 0u;
        }
        float d[QTILES][4] = {};
#pragma unroll
        for (int c = 0; c < CHUNKS; c++)
#pragma unroll
            for (int k = 0; k < QTILES; k++) {
                mma_bf16(d[k], x[0][c].x, x[1][c].x, x[0][c].y, x[1][c].y, qb[c][0][k][0],
                         qb[c][0][k][1]);
                mma_bf16(d[k], x[0][c].z, x[1][c].z, x[0][c].w, x[1][c].w, qb[c][1][k][0],
                         qb[c][1][k][1]);
            }
        // Lane t holds columns 2t, 2t + 1 of rows g and g + 8 of each tile. One tile: lanes
        // t < 2 hold heads 2t, 2t + 1 and lanes t + 2 their rests. Two: every lane holds heads
        // 2t, 2t + 1, their parts in the first tile and their rests in the second.
        float s[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            s[j] = QTILES == 1 ? d[0][j] + __shfl_xor_sync(TK_FULL, d[0][j], 2)
                               : d[0][j] + d[QTILES - 1][j];
        const bool holds = QTILES == 2 || t < 2;
        const int i = tile * 16 + g;
        if (PER_HEAD) {
            if (holds) {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int row = i + 8 * (j >> 1), h = 2 * t + (j & 1);
                    if (row < n && h < GROUP) put(row, h, s[j]);
                }
            }
        } else {
            const float ninf = __int_as_float(0xff800000);
            const bool h0 = holds && 2 * t < GROUP, h1 = holds && 2 * t + 1 < GROUP;
            float bg = fmaxf(h0 ? s[0] : ninf, h1 ? s[1] : ninf);
            float bg8 = fmaxf(h0 ? s[2] : ninf, h1 ? s[3] : ninf);
#pragma unroll
            for (int o = 1; o < 4; o <<= 1) {
                bg = fmaxf(bg, __shfl_xor_sync(TK_FULL, bg, o));
                bg8 = fmaxf(bg8, __shfl_xor_sync(TK_FULL, bg8, o));
            }
            if (t == 0 && i < n) put(i, 0, bg);
            if (t == 0 && i + 8 < n) put(i + 8, 0, bg8);
        }
    }
}
#endif
