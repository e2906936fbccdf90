// Pages on the tensor cores (mma.cu's products, mma_keys.cu's scores): a warp's loop over its
// pages of one work item, compiled in front of attention.cu where MMA_PAGES holds: MMA_KEYS,
// and either an fp8 pool or a bf16 pool with more than 4 query heads per KV head. On the CUDA
// cores a page costs 2 x GROUP multiply-adds per element, which bounds the loop by its
// instructions, not its bytes: fp8 from 4 query heads per KV head, bf16 from 5. Here a page
// costs 32 m16n8k16 products (f16 for fp8 pools after 64 pair conversions, bf16 for bf16 pools
// as stored) and 32 byte permutes.
//
// Scores as mma_keys.cu lays them out. Output: O (16 rows x 8 dims, OUT_TILES = HEAD_DIM / 8
// tiles) = P V, the probabilities' parts in A's rows 0..7 (they fall out of the score tiles in
// A's layout) and their rests in rows 8..15; V's dims OUT_TILES n + j for column n of tile j.

// Work items per KV head (attention.cu); set by the host.
#ifndef KV_SPLIT
#define KV_SPLIT 1
#endif

// A page-table row's page ids. A row an index kernel writes while the attention runs (a table
// with ready flags, COHERENT) is read past L1, which may hold a neighbouring row's line from
// before the row was written; other tables take the read-only cache. A compile-time choice:
// decided at run time, the branch kept the compiler from loading ids early, and dense attention
// at 128K took 0.8% longer.
template <bool COHERENT>
struct PageIds {
    const unsigned int* __restrict__ ids;
    __device__ __forceinline__ unsigned int operator[](unsigned int i) const {
        return COHERENT ? __ldcg(ids + i) : __ldg(ids + i);
    }
};

#if KV_FP8
#define MMA_GROUP_MIN 1
#else
#define MMA_GROUP_MIN 5
#endif
#if MMA_KEYS && GROUP >= MMA_GROUP_MIN && !defined(NO_MMA_PAGES)
#define MMA_PAGES 1
#define OUT_TILES (HEAD_DIM / 8)
// 16-byte vectors of the OUT_TILES dims of V a lane takes: one whose first 8 bytes hold them
// when they are 8 (fp8 at head_dim 64).
#define V_BYTES (OUT_TILES * KV_BYTES)
#define V_V (V_BYTES < 16 ? 1 : V_BYTES / 16)

// One page's K and V for lane (g, t), as 16-byte vectors of the pool: K as mma_load_keys loads
// it; V tokens 2 t, 2 t + 1, 2 t + 8, 2 t + 9, dims [OUT_TILES g, OUT_TILES (g + 1)) (V_V vectors
// each). Tokens past `valid` are zeros.
struct MmaPage {
    uint4 k[2 * K_V], v[4 * V_V];
};

__device__ __forceinline__ void mma_load(const uint4* __restrict__ kpool,
                                         const uint4* __restrict__ vpool, unsigned int page,
                                         int head, int kv_heads, int g, int t, int valid,
                                         MmaPage& p) {
    const size_t base =
        ((size_t)page * (kv_heads / KV_SPLIT) + head / KV_SPLIT) * (PAGE_SIZE * ROW_V);
    const uint4 zero = make_uint4(0, 0, 0, 0);
    mma_load_keys(kpool, base, g, t, valid, p.k);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int tok = 2 * t + (i & 1) + 8 * (i >> 1);
#if V_BYTES == 8
        const uint2* row = reinterpret_cast<const uint2*>(vpool + base + tok * ROW_V);
        const uint2 h = tok < valid ? __ldg(row + g) : make_uint2(0, 0);
        p.v[i] = make_uint4(h.x, h.y, 0, 0);
#else
        const size_t o = base + tok * ROW_V + V_V * g;
#pragma unroll
        for (int j = 0; j < V_V; j++) p.v[V_V * i + j] = tok < valid ? __ldg(vpool + o + j) : zero;
#endif
    }
}

// The B operand of output tile j: V dim OUT_TILES g + j of tokens 2 t, 2 t + 1 (b0) and 2 t + 8,
// 2 t + 9 (b1).
__device__ __forceinline__ void value_operand(const MmaPage& p, int j, unsigned int& b0,
                                              unsigned int& b1) {
#if KV_FP8
    const unsigned int sel = (unsigned int)(j & 3) | ((unsigned int)(4 + (j & 3)) << 4);
    const int i = j >> 2;
    b0 = e4m3x2_f16x2(__byte_perm(word(p.v[0], i), word(p.v[1], i), sel));
    b1 = e4m3x2_f16x2(__byte_perm(word(p.v[2], i), word(p.v[3], i), sel));
#else
    const unsigned int sel = (j & 1) ? 0x7632u : 0x5410u;
    const int h = j >> 3, i = (j & 7) >> 1;
    b0 = __byte_perm(word(p.v[h], i), word(p.v[V_V + h], i), sel);
    b1 = __byte_perm(word(p.v[2 * V_V + h], i), word(p.v[3 * V_V + h], i), sel);
#endif
}

// The warp's pages of item `w` (attention.cu's Work): pages w.start + warp, + WARPS, ... Leaves
// the warp's online softmax per query head in `acc_out` ([GROUP][HEAD_DIM], unnormalised),
// `m_out` and `l_out` (max and sum, log2 domain).
template <class Item, class Ids>
__device__ __forceinline__ void mma_pages(const Item w, const kv_vec* __restrict__ kpool_,
                                          const kv_vec* __restrict__ vpool_,
                                          const unsigned int* __restrict__ indptr,
                                          const Ids indices,
                                          const unsigned int* __restrict__ last_len,
                                          const float* __restrict__ q, int kv_heads,
                                          float scale_log2, int warp, int lane,
                                          float (*acc_out)[HEAD_DIM], float* m_out,
                                          float* l_out) {
    const uint4* kpool = reinterpret_cast<const uint4*>(kpool_);
    const uint4* vpool = reinterpret_cast<const uint4*>(vpool_);
    const int g = lane >> 2, t = lane & 3;
    // Query head g's dims [LANE_DIMS t, LANE_DIMS (t + 1)), pre-scaled for exp2.
    const float* qh =
        q + (((size_t)w.seq * kv_heads + w.head) * GROUP + g) * HEAD_DIM + LANE_DIMS * t;
    unsigned int qa[MMA_CHUNKS][4];
    const float down = query_operand(qh, g < GROUP, scale_log2, qa);

    float m = MMA_NEG_INF, l = 0.f;
    float acc[OUT_TILES][4];
#pragma unroll
    for (int j = 0; j < OUT_TILES; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[j][i] = 0.f;

    const unsigned int base = indptr[w.row];
    const int row_pages = (int)(indptr[w.row + 1] - base);
    const int last = (int)last_len[w.row];
    MmaPage cur;
#if PREFETCH
    unsigned int next =
        w.start + warp + WARPS < w.end ? indices[base + w.start + warp + WARPS] : 0u;
    if (w.start + warp < w.end)
        mma_load(kpool, vpool, indices[base + w.start + warp], w.head, kv_heads, g, t,
                 w.start + warp == row_pages - 1 ? last : PAGE_SIZE, cur);
#endif
    for (int p = w.start + warp; p < w.end; p += WARPS) {
        const int valid = p == row_pages - 1 ? last : PAGE_SIZE;
#if PREFETCH
        MmaPage nxt;
        const int pn = p + WARPS;
        if (pn < w.end) {
            mma_load(kpool, vpool, next, w.head, kv_heads, g, t,
                     pn == row_pages - 1 ? last : PAGE_SIZE, nxt);
            if (pn + WARPS < w.end) next = indices[base + pn + WARPS];
        }
#else
        mma_load(kpool, vpool, indices[base + p], w.head, kv_heads, g, t, valid, cur);
#endif
        // Scores of tokens 8 i + 2 t + {0, 1}.
        float s[2][2];
        mma_page_scores(cur.k, qa, down, t, valid, s);
        float mx = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
        mx = fmaxf(mx, __shfl_xor_sync(MMA_FULL, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(MMA_FULL, mx, 2));
        const float mn = fmaxf(m, mx);
        const float corr = exp2f(m - mn);
        m = mn;
        l *= corr;
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                s[i][j] = exp2f(s[i][j] - mn);
                l += s[i][j];
            }
#pragma unroll
        for (int j = 0; j < OUT_TILES; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[j][i] *= corr;
        const unsigned int p0 = half2(s[0][0], s[0][1]), p1 = half2(s[1][0], s[1][1]);
        const unsigned int r0 = half2(s[0][0] - half_low(p0), s[0][1] - half_high(p0));
        const unsigned int r1 = half2(s[1][0] - half_low(p1), s[1][1] - half_high(p1));
#pragma unroll
        for (int j = 0; j < OUT_TILES; j++) {
            unsigned int b0, b1;
            value_operand(cur, j, b0, b1);
            MMA_PAGE(acc[j], p0, r0, p1, r1, b0, b1);
        }
#if PREFETCH
        cur = nxt;
#endif
    }
    l += __shfl_xor_sync(MMA_FULL, l, 1);
    l += __shfl_xor_sync(MMA_FULL, l, 2);
    if (g < GROUP) {
#pragma unroll
        for (int j = 0; j < OUT_TILES; j++) {
            acc_out[g][OUT_TILES * (2 * t) + j] = acc[j][0] + acc[j][2];
            acc_out[g][OUT_TILES * (2 * t + 1) + j] = acc[j][1] + acc[j][3];
        }
        if (t == 0) {
            m_out[g] = m;
            l_out[g] = l;
        }
    }
}
#else
#define MMA_PAGES 0
#endif
