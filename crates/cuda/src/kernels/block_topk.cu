// Index phase of block top-k and Quest in one kernel per step: one block per (sequence, KV head)
// scores the candidate pages from their summaries into shared memory, takes the top-k there
// (topk.cu, compiled in front of this file) and writes the sparse page table row.
// Defines: HEAD_DIM, GROUP, SUMMARIES (1: bf16 centroid, score q . c; 2: bf16 kmax and kmin,
// score sum over dims of max(q kmax, q kmin)). A page's score is the best over the group's
// query heads. Centroid scores of up to 4 query heads per KV head run on the tensor cores. Summaries are laid out as the CPU's page fields: [kv_head][pool page][HEAD_DIM].

#define LPT (HEAD_DIM / 8)
#define TPL (32 / LPT)
#define ROW_VEC (HEAD_DIM / 8)
#define UNROLL (8 / SUMMARIES)
#if SUMMARIES == 1 && GROUP <= 4 && HEAD_DIM % 32 == 0 && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define MMA_SCORES 1
#define CHUNKS (HEAD_DIM / 32)
#define LINES ((HEAD_DIM * 2 + 127) / 128)  // 128-byte lines of a centroid
#else
#define MMA_SCORES 0
#endif

// One row of selection: the pages `first..first + pages` of the dense table are the sequence's
// logical pages; pages `sinks..pages - recent` are candidates, `k` of them are kept.
struct __align__(16) SelRow {
    int seq, head, pages, sinks;
    int recent, k, out, dense;  // out: first slot in the sparse indices; dense: no index phase
};

__device__ __forceinline__ float bf_lo(unsigned int w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(unsigned int w) { return __uint_as_float(w & 0xffff0000u); }

#if MMA_SCORES
// bf16 bits of x, rounded to nearest even (finite x).
__device__ __forceinline__ unsigned int bf16_bits(float x) {
    const unsigned int u = __float_as_uint(x);
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

// d += a b for one m16n8k16 tile: a 16 x 16 bf16 (row), b 16 x 8 bf16 (col), d f32.
__device__ __forceinline__ void mma_bf16(float* d, unsigned int a0, unsigned int a1,
                                         unsigned int a2, unsigned int a3, unsigned int b0,
                                         unsigned int b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
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
// m16n8k16 products whose columns are the group's queries, each split into its bf16 part
// (columns 0..3) and the bf16 rest (columns 4..7), so the f32 sums see the f32 query to about
// 2^-16. Both sides permute the dims alike (a lane loads 16 contiguous bytes of a centroid per
// 32 dims), which leaves each dot product as it was. Writes tk_keys[0..n).
__device__ __forceinline__ void mma_scores(const uint4* __restrict__ f0, size_t head_off,
                                           const unsigned int* __restrict__ cand, int n,
                                           const float* __restrict__ qrow,
                                           unsigned int* tk_keys) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3, hq = g & 3;
    unsigned int qb[CHUNKS][2][2];
#pragma unroll
    for (int c = 0; c < CHUNKS; c++)
#pragma unroll
        for (int m = 0; m < 2; m++) {
            unsigned int p[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float x = hq < GROUP ? qrow[hq * HEAD_DIM + 32 * c + 8 * t + 4 * m + j] : 0.f;
                const unsigned int hi = bf16_bits(x);
                p[j] = g < 4 ? hi : bf16_bits(x - __uint_as_float(hi << 16));
            }
            qb[c][m][0] = p[0] | (p[1] << 16);
            qb[c][m][1] = p[2] | (p[3] << 16);
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
        float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int c = 0; c < CHUNKS; c++) {
            mma_bf16(d, x[0][c].x, x[1][c].x, x[0][c].y, x[1][c].y, qb[c][0][0], qb[c][0][1]);
            mma_bf16(d, x[0][c].z, x[1][c].z, x[0][c].w, x[1][c].w, qb[c][1][0], qb[c][1][1]);
        }
        // Lane t < 2 holds columns 2t, 2t + 1 (heads 2t, 2t + 1) of rows g and g + 8; lane
        // t + 2 holds their low parts.
        float s[4];
#pragma unroll
        for (int j = 0; j < 4; j++) s[j] = d[j] + __shfl_xor_sync(TK_FULL, d[j], 2);
        const float ninf = __int_as_float(0xff800000);
        float bg = fmaxf(2 * t < GROUP ? s[0] : ninf, 2 * t + 1 < GROUP ? s[1] : ninf);
        float bg8 = fmaxf(2 * t < GROUP ? s[2] : ninf, 2 * t + 1 < GROUP ? s[3] : ninf);
        bg = fmaxf(bg, __shfl_xor_sync(TK_FULL, bg, 1));
        bg8 = fmaxf(bg8, __shfl_xor_sync(TK_FULL, bg8, 1));
        const int i = tile * 16 + g;
        if (t == 0 && i < n) tk_keys[i] = tk_key(bg);
        if (t == 0 && i + 8 < n) tk_keys[i + 8] = tk_key(bg8);
    }
}
#endif

// grid: rows; block: TOPK_THREADS; dynamic shared memory: 4 bytes per candidate of the longest
// row. `tolerance > 0` selects the approximate top-k with that recall tolerance.
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
index_select(const uint4* __restrict__ f0, const uint4* __restrict__ f1, int num_pages,
             const unsigned int* __restrict__ dense_indptr,
             const unsigned int* __restrict__ dense_indices, const float* __restrict__ q,
             const SelRow* __restrict__ rows, int kv_heads, float tolerance,
             unsigned int* __restrict__ out) {
    extern __shared__ unsigned int tk_keys[];
    __shared__ TopkShared s;
    const SelRow r = rows[blockIdx.x];
    const unsigned int* logical = dense_indices + dense_indptr[r.seq];
    unsigned int* dst = out + r.out;
    for (int j = threadIdx.x; j < r.sinks; j += TOPK_THREADS) dst[j] = logical[j];
    for (int j = threadIdx.x; j < r.recent; j += TOPK_THREADS)
        dst[r.sinks + r.k + j] = logical[r.pages - r.recent + j];
    if (r.k <= 0) return;
    const int n = r.pages - r.sinks - r.recent;
    const unsigned int* cand = logical + r.sinks;
#if MMA_SCORES
    mma_scores(f0, (size_t)r.head * num_pages * ROW_VEC, cand, n,
               q + ((size_t)r.seq * kv_heads + r.head) * GROUP * HEAD_DIM, tk_keys);
#else
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int tg = lane / LPT, dl = lane % LPT;
    float qr[GROUP][8];
    const float* qg = q + ((size_t)r.seq * kv_heads + r.head) * GROUP * HEAD_DIM + dl * 8;
#pragma unroll
    for (int h = 0; h < GROUP; h++)
#pragma unroll
        for (int j = 0; j < 8; j++) qr[h][j] = qg[h * HEAD_DIM + j];
    const size_t head_off = (size_t)r.head * num_pages * ROW_VEC + dl;
    // Each step loads the summaries of UNROLL pages per token group, and the page ids of its
    // next step with them, so no summary load waits on a page-id load.
    const int stride = TK_WARPS * TPL * UNROLL;
    unsigned int ids[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
        const int i = warp * TPL * UNROLL + u * TPL + tg;
        ids[u] = i < n ? cand[i] : 0u;
    }
    for (int base = warp * TPL * UNROLL; base < n; base += stride) {
        uint4 a[UNROLL];
#if SUMMARIES == 2
        uint4 b[UNROLL];
#endif
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int i = base + u * TPL + tg;
            const size_t o = head_off + (size_t)ids[u] * ROW_VEC;
            a[u] = i < n ? __ldg(f0 + o) : make_uint4(0, 0, 0, 0);
#if SUMMARIES == 2
            b[u] = i < n ? __ldg(f1 + o) : make_uint4(0, 0, 0, 0);
#endif
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int i = base + stride + u * TPL + tg;
            ids[u] = i < n ? cand[i] : 0u;
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int i = base + u * TPL + tg;
            const unsigned int wa[4] = {a[u].x, a[u].y, a[u].z, a[u].w};
#if SUMMARIES == 2
            const unsigned int wb[4] = {b[u].x, b[u].y, b[u].z, b[u].w};
#endif
            float best = __int_as_float(0xff800000);
#pragma unroll
            for (int h = 0; h < GROUP; h++) {
                float acc = 0.f;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const float x0 = qr[h][2 * j], x1 = qr[h][2 * j + 1];
#if SUMMARIES == 2
                    acc += fmaxf(x0 * bf_lo(wa[j]), x0 * bf_lo(wb[j]));
                    acc += fmaxf(x1 * bf_hi(wa[j]), x1 * bf_hi(wb[j]));
#else
                    acc = fmaf(x0, bf_lo(wa[j]), acc);
                    acc = fmaf(x1, bf_hi(wa[j]), acc);
#endif
                }
#pragma unroll
                for (int o = LPT / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(TK_FULL, acc, o);
                best = fmaxf(best, acc);
            }
            if (i < n && dl == 0) tk_keys[i] = tk_key(best);
        }
    }
#endif
    __syncthreads();
    int required = r.k;
    if (tolerance > 0.f) required = min(r.k, (int)ceil((1.0 - (double)tolerance) * r.k));
    tk_select(s, tk_keys, n, r.k, required,
              [&](int pos, int i) { dst[r.sinks + pos] = cand[i]; });
}
