// Index phase of block top-k and Quest in one kernel per step: one block (or a cluster of
// blocks) per (sequence, KV head) scores the candidate pages from their summaries into shared
// memory, takes the top-k there (topk.cu, scores.cu, index_row.cu and cluster.cu, compiled in
// front of this file) and writes the sparse page table row.
// Defines: HEAD_DIM, GROUP, SUMMARIES (1: a centroid, score q . c; 2: kmax and kmin, score
// sum over dims of max(q kmax, q kmin)), FIELD_FP8 (1: summaries in fp8 e4m3, else bf16). A
// page's score is the best over the group's query heads. Centroids and fp8 envelopes are
// scored on the tensor cores where scores.cu can (up to 8 query heads per KV head, HEAD_DIM a
// multiple of 32, compute capability 8.0 or later), else on the CUDA cores.
// Summaries are laid out as the CPU's page fields: [kv_head][pool page][HEAD_DIM].

#define LPT (HEAD_DIM / 8)
#define TPL (32 / LPT)
// Pages a token group loads at once; fp8 envelopes take as many bytes as bf16 ones.
#define UNROLL (FIELD_FP8 ? 8 : 8 / SUMMARIES)
// Quest's bf16 envelopes stay on the CUDA cores: with 2 query heads per KV head they are
// bandwidth-bound there, and the tensor cores were slower.
#define MMA_SCORES (MMA_CENTROIDS && (SUMMARIES == 1 || FIELD_FP8))

__device__ __forceinline__ float bf_lo(unsigned int w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(unsigned int w) { return __uint_as_float(w & 0xffff0000u); }

// grid: rows x parts, in clusters of `parts` blocks (a cluster of one where rows are many);
// block: TOPK_THREADS; dynamic shared memory: 4 bytes per candidate of the longest row. The
// blocks of a cluster take one row: each scores its share of the candidates into the keys of
// the first, which ranks them, so that a step of few rows does not leave most multiprocessors
// idle. `tolerance > 0` selects the approximate top-k with that recall tolerance; `ready` (or
// null) takes the rows' ready flags. With `after_prev` the kernel was launched as a dependent
// of the one before it (launch.rs): the row and the first page ids of the block's share, which
// only the host writes, load while that kernel drains; the queries and summaries, which it may
// have written, and the sparse table and ready flags, which an attention before it may still
// read, wait for it to finish.
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
index_select(const sum_vec* __restrict__ f0, const sum_vec* __restrict__ f1, int num_pages,
             const unsigned int* __restrict__ dense_indptr,
             const unsigned int* __restrict__ dense_indices, const float* __restrict__ q,
             const SelRow* __restrict__ rows, int kv_heads, float tolerance,
             unsigned int* __restrict__ out, unsigned int* ready, int ready_at_block,
             int after_prev) {
    extern __shared__ unsigned int tk_keys[];
    __shared__ TopkShared s;
    const unsigned int parts = cluster_ranks(), part = cluster_rank();
    if (parts > 1) cluster_arrive();
    const int row = blockIdx.x / parts;
    const SelRow r = rows[row];
    const unsigned int* logical = dense_indices + dense_indptr[r.seq];
    // This block's candidates: [lo, lo + m) of the row's n, in whole tiles of 16.
    const int n = r.pages - r.sinks - r.recent;
    const int share = ((n + (int)parts - 1) / (int)parts + 15) & ~15;
    const int lo = min(n, (int)part * share), m = min(n - lo, share);
    if (after_prev) {
        if ((int)threadIdx.x < m) {
            const unsigned int id = logical[r.sinks + lo + threadIdx.x];
            asm volatile("" ::"r"(id));  // loaded now, so the scoring finds it in L1
        }
#if __CUDA_ARCH__ >= 900
        asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    }
    const RowReady signal(ready, rows, kv_heads, ready_at_block, row, part == 0);
    unsigned int* dst = out + r.out;
    if (part == 0) write_edges(r, logical, dst);
    // Every block of the cluster has started: the first one's keys may be written.
    if (parts > 1) cluster_wait();
    if (r.k <= 0) return;
    const unsigned int* cand = logical + r.sinks + lo;
    const unsigned int keys = parts > 1 && m > 0 ? remote(tk_keys + lo, 0) : 0u;
    const auto put = [&](int i, float x) {
        if (parts > 1)
            store_at(keys + 4u * (unsigned int)i, tk_key(x));
        else
            tk_keys[i] = tk_key(x);
    };
#if MMA_SCORES
    mma_scores<false>(f0, f1, (size_t)r.head * num_pages * ROW_VEC, cand, m,
                      q + ((size_t)r.seq * kv_heads + r.head) * GROUP * HEAD_DIM,
                      [&](int i, int, float x) { put(i, x); });
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
        ids[u] = i < m ? cand[i] : 0u;
    }
    for (int base = warp * TPL * UNROLL; base < m; base += stride) {
        sum_vec a[UNROLL];
#if SUMMARIES == 2
        sum_vec b[UNROLL];
#endif
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int i = base + u * TPL + tg;
            const size_t o = head_off + (size_t)ids[u] * ROW_VEC;
            a[u] = i < m ? __ldg(f0 + o) : sum_vec{};
#if SUMMARIES == 2
            b[u] = i < m ? __ldg(f1 + o) : sum_vec{};
#endif
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int i = base + stride + u * TPL + tg;
            ids[u] = i < m ? cand[i] : 0u;
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int i = base + u * TPL + tg;
            const uint4 av = sum_words(a[u]);
            const unsigned int wa[4] = {av.x, av.y, av.z, av.w};
#if SUMMARIES == 2
            const uint4 bv = sum_words(b[u]);
            const unsigned int wb[4] = {bv.x, bv.y, bv.z, bv.w};
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
            if (i < m && dl == 0) put(i, best);
        }
    }
#endif
    if (parts > 1) {
        cluster_sync();
        if (part != 0) return;
    } else {
        __syncthreads();
    }
    tk_select(s, tk_keys, n, r.k, required_of(r.k, tolerance),
              [&](int pos, int i) { dst[r.sinks + pos] = logical[r.sinks + i]; });
}
