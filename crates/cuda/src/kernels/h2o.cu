// Index phase of the built-in h2o flow, one block (or a cluster of blocks, as block_topk.cu's)
// per (sequence, KV head) row. Each complete page gets its estimated attention: for each query
// head of the group, a softmax over the pages of q . centroid / sqrt(HEAD_DIM), then the mean
// over the group. That adds to the request's
// accumulated mass for the page, which is saved, and the candidates' masses go through the top-k
// (topk.cu, compiled in front of this file with scores.cu, index_row.cu and cluster.cu) into the
// sparse page table row.
// Defines: HEAD_DIM, GROUP. Centroids are [kv_head][pool page][HEAD_DIM] bf16; the mass of a
// layer is [slot][kv_head][state page] f32, indexed by the request's logical pages.

#define LPT (HEAD_DIM / 8)  // lanes per page: 8 dims each
#define TPL (32 / LPT)      // pages per warp step
#define UNROLL 4

__device__ __forceinline__ float h2o_lo(unsigned int w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float h2o_hi(unsigned int w) { return __uint_as_float(w & 0xffff0000u); }

// Per query head, the block's maximum (MAX) or sum of each thread's `v`, into `res`.
template <bool MAX>
__device__ __forceinline__ void h2o_reduce(float (&v)[GROUP], float (*part)[TK_WARPS],
                                           float* res) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int h = 0; h < GROUP; h++) {
        float x = v[h];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float y = __shfl_xor_sync(TK_FULL, x, o);
            x = MAX ? fmaxf(x, y) : x + y;
        }
        if (lane == 0) part[h][warp] = x;
    }
    __syncthreads();
    if (threadIdx.x < GROUP) {
        const int h = threadIdx.x;
        float x = part[h][0];
        for (int w = 1; w < TK_WARPS; w++) x = MAX ? fmaxf(x, part[h][w]) : x + part[h][w];
        res[h] = x;
    }
    __syncthreads();
}

// grid: rows x parts, in clusters of `parts` blocks; block: TOPK_THREADS; dynamic shared memory:
// 4 (GROUP + 1) bytes per page of the longest row. The blocks of a cluster each score a share of
// the row's pages into the first one's shared memory, which does the rest. `slots[seq]` is the
// sequence's state slot; `dense_last[seq]` the tokens of its last page. `tolerance > 0` selects
// the approximate top-k with that recall tolerance.
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
h2o_select(const uint4* __restrict__ centroid, int num_pages,
           const unsigned int* __restrict__ dense_indptr,
           const unsigned int* __restrict__ dense_indices,
           const unsigned int* __restrict__ dense_last, int page_size, const float* __restrict__ q,
           const SelRow* __restrict__ rows, const int* __restrict__ slots, int kv_heads,
           float* __restrict__ mass, int state_pages, float tolerance,
           unsigned int* __restrict__ out, unsigned int* ready, int ready_at_block) {
    extern __shared__ float h2o_scores[];
    __shared__ TopkShared s;
    __shared__ float part[GROUP][TK_WARPS];
    __shared__ float top[GROUP], total[GROUP];
    const unsigned int parts = cluster_ranks(), rank = cluster_rank();
    if (parts > 1) cluster_arrive();
    const int row = blockIdx.x / parts;
    const RowReady signal(ready, rows, kv_heads, ready_at_block, row, rank == 0);
    const SelRow r = rows[row];
    const unsigned int* logical = dense_indices + dense_indptr[r.seq];
    unsigned int* dst = out + r.out;
    if (rank == 0) write_edges(r, logical, dst);
    // Every block of the cluster has started: the first one's scores may be written.
    if (parts > 1) cluster_wait();
    if (r.dense) return;
    const int n = min(r.pages - (dense_last[r.seq] < (unsigned int)page_size ? 1 : 0), state_pages);
    const int cand_n = r.pages - r.sinks - r.recent;
    float* sc = h2o_scores;  // [GROUP][n]
    unsigned int* keys = reinterpret_cast<unsigned int*>(h2o_scores + GROUP * n);
    // This block's pages: [lo, lo + own), in whole tiles of 16.
    const int share = ((n + (int)parts - 1) / (int)parts + 15) & ~15;
    const int lo = min(n, (int)rank * share), own = min(n - lo, share);
    const unsigned int first = parts > 1 ? remote(sc, 0) : 0u;
    const auto put = [&](int i, int h, float x) {
        if (parts > 1)
            store_at(first + 4u * (unsigned int)(h * n + lo + i), __float_as_uint(x));
        else
            sc[h * n + i] = x;
    };

    const float scale = 1.0f / sqrtf((float)HEAD_DIM);
#if MMA_CENTROIDS
    mma_scores<true>(centroid, nullptr, (size_t)r.head * num_pages * ROW_VEC, logical + lo, own,
                     q + ((size_t)r.seq * kv_heads + r.head) * GROUP * HEAD_DIM,
                     [&](int i, int h, float x) { put(i, h, x * scale); });
#else
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int tg = lane / LPT, dl = lane % LPT;
    float qr[GROUP][8];
    const float* qg = q + ((size_t)r.seq * kv_heads + r.head) * GROUP * HEAD_DIM + dl * 8;
#pragma unroll
    for (int h = 0; h < GROUP; h++)
#pragma unroll
        for (int j = 0; j < 8; j++) qr[h][j] = qg[h * HEAD_DIM + j];
    const uint4* c0 = centroid + (size_t)r.head * num_pages * ROW_VEC + dl;
    const unsigned int* pages = logical + lo;
    const int stride = TK_WARPS * TPL * UNROLL;
    for (int base = warp * TPL * UNROLL; base < own; base += stride) {
        uint4 a[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int j = base + u * TPL + tg;
            a[u] = j < own ? __ldg(c0 + (size_t)pages[j] * ROW_VEC) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int j = base + u * TPL + tg;
            const unsigned int w[4] = {a[u].x, a[u].y, a[u].z, a[u].w};
#pragma unroll
            for (int h = 0; h < GROUP; h++) {
                float acc = 0.f;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    acc = fmaf(qr[h][2 * i], h2o_lo(w[i]), acc);
                    acc = fmaf(qr[h][2 * i + 1], h2o_hi(w[i]), acc);
                }
#pragma unroll
                for (int o = LPT / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(TK_FULL, acc, o);
                if (j < own && dl == 0) put(j, h, acc * scale);
            }
        }
    }
#endif
    if (parts > 1) {
        cluster_sync();
        if (rank != 0) return;
    } else {
        __syncthreads();
    }

    // The softmax over the pages, for each query head.
    float v[GROUP];
#pragma unroll
    for (int h = 0; h < GROUP; h++) v[h] = __int_as_float(0xff800000);
    for (int j = threadIdx.x; j < n; j += TOPK_THREADS)
#pragma unroll
        for (int h = 0; h < GROUP; h++) v[h] = fmaxf(v[h], sc[h * n + j]);
    h2o_reduce<true>(v, part, top);
#pragma unroll
    for (int h = 0; h < GROUP; h++) v[h] = 0.f;
    for (int j = threadIdx.x; j < n; j += TOPK_THREADS)
#pragma unroll
        for (int h = 0; h < GROUP; h++) v[h] += expf(sc[h * n + j] - top[h]);
    h2o_reduce<false>(v, part, total);

    float* m = mass + ((size_t)slots[r.seq] * kv_heads + r.head) * state_pages;
    for (int j = threadIdx.x; j < n; j += TOPK_THREADS) {
        float attn = 0.f;
#pragma unroll
        for (int h = 0; h < GROUP; h++) attn += expf(sc[h * n + j] - top[h]) / total[h];
        const float t = m[j] + attn / GROUP;
        m[j] = t;
        if (j >= r.sinks && j - r.sinks < cand_n) keys[j - r.sinks] = tk_key(t);
    }
    __syncthreads();
    if (r.k <= 0) return;
    const unsigned int* cand = logical + r.sinks;
    tk_select(s, keys, cand_n, r.k, required_of(r.k, tolerance),
              [&](int pos, int i) { dst[r.sinks + pos] = cand[i]; });
}
