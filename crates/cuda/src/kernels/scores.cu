// Centroid scores on the tensor cores, shared by the index kernels that score pages from a
// centroid (block_topk.cu, h2o.cu; topk.cu and mma.cu are compiled in front, and kv_elem.cu
// where FIELD_FP8 is 1), and Quest's envelope bounds from fp8 fields (SUMMARIES 2).
// Defines: HEAD_DIM, GROUP, and optionally FIELD_FP8 and SUMMARIES.
// Summaries are [kv_head][pool page][HEAD_DIM], bf16 or (FIELD_FP8 1) fp8 e4m3, a row ROW_VEC
// vectors of 8 values (sum_vec).

#ifndef FIELD_FP8
#define FIELD_FP8 0
#endif
#ifndef SUMMARIES
#define SUMMARIES 1
#endif
// Two fields kmax >= kmin: sum_d max(q_d kmax_d, q_d kmin_d) = max(q, 0) . kmax + min(q, 0) . kmin,
// two products into the same sums.
#define ENVELOPE (SUMMARIES == 2)
#define ROW_VEC (HEAD_DIM / 8)
#if FIELD_FP8
typedef uint2 sum_vec;
// Eight e4m3 values -> their bf16 pairs, in order (exact).
__device__ __forceinline__ uint4 sum_words(uint2 v) {
    return make_uint4(kv_fp8x2_to_bf16x2(__byte_perm(v.x, 0, 0x4140)),
                      kv_fp8x2_to_bf16x2(__byte_perm(v.x, 0, 0x4342)),
                      kv_fp8x2_to_bf16x2(__byte_perm(v.y, 0, 0x4140)),
                      kv_fp8x2_to_bf16x2(__byte_perm(v.y, 0, 0x4342)));
}
#else
typedef uint4 sum_vec;
__device__ __forceinline__ uint4 sum_words(uint4 v) { return v; }
#endif
#if GROUP <= 8 && HEAD_DIM % 32 == 0 && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define MMA_CENTROIDS 1
// fp8 centroids widen to f16 in one instruction a pair from compute capability 8.9: the
// products then take f16 operands.
#define MMA_F16 (FIELD_FP8 && __CUDA_ARCH__ >= 890)
#define CHUNKS (HEAD_DIM / 32)
#define LINES ((HEAD_DIM * (FIELD_FP8 ? 1 : 2) + 127) / 128)  // 128-byte lines of a centroid
// Tiles of 16 candidates a warp loads at once: an fp8 centroid is half a bf16 one's bytes, and
// the scoring waits on loads, so fp8 takes two tiles a step to keep as many bytes in flight
// (a pair of fp8 envelopes is a bf16 centroid's bytes).
#define STEP_TILES (FIELD_FP8 && !ENVELOPE ? 2 : 1)
#define GROUPS (2 * STEP_TILES)
// Up to 4 query heads, one n8 tile holds their bf16 parts (columns 0..3) and rests (4..7); up
// to 8, one tile holds the 8 parts and a second the 8 rests.
#define QTILES (GROUP <= 4 ? 1 : 2)
// How many steps ahead of the one loading the summaries are fetched into L2 (block_topk.rs sets
// it per kind of summary).
#ifndef AHEAD
#define AHEAD 1
#endif
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

#if MMA_F16
// The same split into f16 parts and rests (about 2^-22 of the row's largest value together,
// once the row is scaled as below).
__device__ __forceinline__ void query_words(const float (&x)[4], bool rest, unsigned int& w0,
                                            unsigned int& w1) {
    unsigned int p[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        unsigned short hi, lo;
        float back;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(hi) : "f"(x[j]));
        asm("cvt.f32.f16 %0, %1;" : "=f"(back) : "h"(hi));
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(lo) : "f"(x[j] - back));
        p[j] = rest ? lo : hi;
    }
    w0 = p[0] | (p[1] << 16);
    w1 = p[2] | (p[3] << 16);
}

// Eight e4m3 centroid values -> their f16 pairs, in order, one conversion a pair.
__device__ __forceinline__ uint4 mma_words(uint2 v) {
    return make_uint4(e4m3x2_f16x2(v.x), e4m3x2_f16x2(v.x >> 16), e4m3x2_f16x2(v.y),
                      e4m3x2_f16x2(v.y >> 16));
}
#define mma_sum mma_f16
#else
#define query_words bf16_words
#define mma_words sum_words
#define mma_sum mma_bf16
#endif

// A 16-byte load through the read-only path, emitted ahead of the products that use it (a
// volatile statement keeps its place in the generated code).
__device__ __forceinline__ uint4 ldg_ahead(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// The same for 8 bytes (eight fp8 values).
__device__ __forceinline__ uint2 ldg_ahead(const uint2* p) {
    uint2 v;
    asm volatile("ld.global.nc.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

// Asks L2 for the 128-byte line at p.
__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Centroid scores on the tensor cores: a warp takes 16 candidates a tile as the rows of
// m16n8k16 products whose columns are the group's queries, each split into a part and a rest
// (QTILES; bf16, or f16 with fp8 centroids), so the f32 sums see the f32 query to about 2^-16
// or better. Both sides permute the dims alike (a lane loads 8 contiguous values of a centroid
// per 32 dims), which leaves each dot product as it was. With ENVELOPE, f0 and f1 are kmax and
// kmin, scored against the query's positive and negative parts. Calls put(i, h, score) for
// candidate i < n and each query head h < GROUP (PER_HEAD), else put(i, 0, best score over the
// heads).
template <bool PER_HEAD, class Put>
__device__ __forceinline__ void mma_scores(const sum_vec* __restrict__ f0,
                                           const sum_vec* __restrict__ f1, size_t head_off,
                                           const unsigned int* __restrict__ cand, int n,
                                           const float* __restrict__ qrow, Put put) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3, hq = QTILES == 1 ? g & 3 : g;
    // The warp's lanes hold every value of the group's queries between them.
    float xq[CHUNKS][2][4];
#pragma unroll
    for (int c = 0; c < CHUNKS; c++)
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int j = 0; j < 4; j++)
                xq[c][m][j] = hq < GROUP ? qrow[hq * HEAD_DIM + 32 * c + 8 * t + 4 * m + j] : 0.f;
#if MMA_F16
    // f16 parts hold the query up to 65504 and keep their precision only above 2^-14: every
    // row is scaled by a power of two so that its largest value lies in [2^13, 2^14) before the
    // split, and its scores back (both exact).
    float big = 0.f;
#pragma unroll
    for (int c = 0; c < CHUNKS; c++)
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int j = 0; j < 4; j++) big = fmaxf(big, fabsf(xq[c][m][j]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) big = fmaxf(big, __shfl_xor_sync(TK_FULL, big, o));
    // Clamped so that both scales are normal floats (an all-zero row takes the largest).
    const int e = max(-126, ((__float_as_int(big) >> 23) & 0xff) - 140);
    const float qscale = __int_as_float((127 - e) << 23), sscale = __int_as_float((127 + e) << 23);
#else
    const float qscale = 1.f, sscale = 1.f;
#endif
    // qb: the query (with ENVELOPE its positive part), qn: its negative part.
    unsigned int qb[CHUNKS][2][QTILES][2], qn[ENVELOPE ? CHUNKS : 1][2][QTILES][2];
#pragma unroll
    for (int c = 0; c < CHUNKS; c++)
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int k = 0; k < QTILES; k++) {
                // Column g of tile k: head hq's part, or its rest in columns 4..7 of the one
                // tile, or in the second tile.
                const bool rest = QTILES == 1 ? g >= 4 : k == 1;
                float x[4];
#pragma unroll
                for (int j = 0; j < 4; j++)
                    x[j] = (ENVELOPE ? fmaxf(xq[c][m][j], 0.f) : xq[c][m][j]) * qscale;
                query_words(x, rest, qb[c][m][k][0], qb[c][m][k][1]);
                if constexpr (ENVELOPE) {
#pragma unroll
                    for (int j = 0; j < 4; j++) x[j] = fminf(xq[c][m][j], 0.f) * qscale;
                    query_words(x, rest, qn[c][m][k][0], qn[c][m][k][1]);
                }
            }
    const int tiles = (n + 15) / 16;
    // STEP_TILES tiles a step, 8-row groups r of consecutive candidates. While a step's
    // centroids load, those of the step AHEAD steps on are fetched into L2 (no registers held,
    // so more bytes in flight), and the page ids of the step after that load.
    const int stride = TK_WARPS * STEP_TILES;
    // ids[a][r]: the page ids of row group r, a steps on.
    unsigned int ids[AHEAD + 1][GROUPS];
#pragma unroll
    for (int a = 0; a <= AHEAD; a++)
#pragma unroll
        for (int r = 0; r < GROUPS; r++) {
            const int i = (warp * STEP_TILES + a * stride) * 16 + 8 * r + g;
            ids[a][r] = i < n ? cand[i] : 0u;
        }
    // The rows of the step at tile0 into L2, its page ids `pages`.
    const auto prefetch_step = [&](const unsigned int (&pages)[GROUPS], int tile0) {
#pragma unroll
        for (int li = t; li < SUMMARIES * GROUPS * LINES; li += 4) {
            const int r = li / LINES % GROUPS;
            unsigned int page = pages[0];
#pragma unroll
            for (int k = 1; k < GROUPS; k++) page = r == k ? pages[k] : page;
            const sum_vec* field = li < GROUPS * LINES ? f0 : f1;
            if (tile0 * 16 + 8 * r + g < n)
                prefetch_l2(reinterpret_cast<const char*>(field + head_off +
                                                          (size_t)page * ROW_VEC) +
                            128 * (li % LINES));
        }
    };
#pragma unroll
    for (int a = 1; a < AHEAD; a++) prefetch_step(ids[a], warp * STEP_TILES + a * stride);
    for (int tile0 = warp * STEP_TILES; tile0 < tiles; tile0 += stride) {
        sum_vec x[GROUPS][CHUNKS], y[ENVELOPE ? GROUPS : 1][CHUNKS];
#pragma unroll
        for (int r = 0; r < GROUPS; r++) {
            // Rows past the candidates read page 0 and are never written.
            const size_t row = head_off + (size_t)ids[0][r] * ROW_VEC + t;
#pragma unroll
            for (int c = 0; c < CHUNKS; c++) x[r][c] = ldg_ahead(f0 + row + 4 * c);
            if constexpr (ENVELOPE) {
#pragma unroll
                for (int c = 0; c < CHUNKS; c++) y[r][c] = ldg_ahead(f1 + row + 4 * c);
            }
        }
        prefetch_step(ids[AHEAD], tile0 + AHEAD * stride);
#pragma unroll
        for (int r = 0; r < GROUPS; r++) {
#pragma unroll
            for (int a = 0; a < AHEAD; a++) ids[a][r] = ids[a + 1][r];
            const int i = (tile0 + (AHEAD + 1) * stride) * 16 + 8 * r + g;
            ids[AHEAD][r] = i < n ? cand[i] : 0u;
        }
#pragma unroll
        for (int st = 0; st < STEP_TILES; st++) {
        const int tile = tile0 + st;
        float d[QTILES][4] = {};
#pragma unroll
        for (int c = 0; c < CHUNKS; c++) {
            const uint4 a0 = mma_words(x[2 * st][c]), a1 = mma_words(x[2 * st + 1][c]);
#pragma unroll
            for (int k = 0; k < QTILES; k++) {
                mma_sum(d[k], a0.x, a1.x, a0.y, a1.y, qb[c][0][k][0], qb[c][0][k][1]);
                mma_sum(d[k], a0.z, a1.z, a0.w, a1.w, qb[c][1][k][0], qb[c][1][k][1]);
            }
            if constexpr (ENVELOPE) {
                const uint4 b0 = mma_words(y[2 * st][c]), b1 = mma_words(y[2 * st + 1][c]);
#pragma unroll
                for (int k = 0; k < QTILES; k++) {
                    mma_sum(d[k], b0.x, b1.x, b0.y, b1.y, qn[c][0][k][0], qn[c][0][k][1]);
                    mma_sum(d[k], b0.z, b1.z, b0.w, b1.w, qn[c][1][k][0], qn[c][1][k][1]);
                }
            }
        }
        // Lane t holds columns 2t, 2t + 1 of rows g and g + 8 of each tile. One tile: lanes
        // t < 2 hold heads 2t, 2t + 1 and lanes t + 2 their rests. Two: every lane holds heads
        // 2t, 2t + 1, their parts in the first tile and their rests in the second.
        float s[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            s[j] = (QTILES == 1 ? d[0][j] + __shfl_xor_sync(TK_FULL, d[0][j], 2)
                                : d[0][j] + d[QTILES - 1][j]) *
                   sscale;
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
}
#endif
