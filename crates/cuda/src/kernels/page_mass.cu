// Exact attention mass on each page of a row (sequence, KV head), summed over the group's query
// heads, each head's softmax over every token of the sequence, and the recall of the pages a
// selection kept (`vortex serve --recall-every`). Defines: HEAD_DIM (a multiple of 8),
// PAGE_SIZE, GROUP, CHUNK_PAGES, PM_MMA, KV_FP8 (kv_elem.cu, mma.cu and mma_keys.cu are
// compiled in front).
//
// page_mass_part scores one chunk of a row's pages a block, keeping each page's largest logit
// per query head and its sum of exp(logit - that): on the tensor cores where MMA_KEYS holds
// (PM_MMA), on the CUDA cores elsewhere; page_mass_sum rescales the pages to each head's
// largest logit in the row and normalizes; page_mass_recall compares the masses with the kept
// pages.
//
// A measured row is four integers: its sequence (a row of the dense table), KV head, and the
// place and number of its kept pages in the sparse table's indices.
#define PM_ROW 4

#define PM_THREADS 256
#define PM_WARPS (PM_THREADS / 32)
#define PM_VECS (HEAD_DIM / 8)
// On the CUDA cores, lanes that read one token's key: a power of two, one vector a lane up to
// 8 vectors (head_dim 64), two a lane past that: half the shuffles a token (a layer measured
// 7-10% faster at head_dim 128 than with one vector a lane; four a lane were slower).
#define PM_LANES (PM_VECS > 16 ? 16 : PM_VECS > 4 ? 8 : PM_VECS > 2 ? 4 : PM_VECS > 1 ? 2 : 1)
#define PM_CHUNK (CHUNK_PAGES * PAGE_SIZE)
// Key vectors a lane loads for a token, and tokens a lane group loads at once.
#define PM_VPL ((PM_VECS + PM_LANES - 1) / PM_LANES)
#define PM_UNROLL 4
// A lane's part of the queries in registers where it is small (read from shared memory for
// every key, it bounded the scoring).
#define PM_Q_REGS (PM_VPL * GROUP <= 8)
// A row's masses that page_mass_recall holds in shared memory (longer rows are read from device
// memory, slowly).
#define PM_SHARED_PAGES 8192
#define PM_NEG_INF (__int_as_float(0xff800000))

struct PmMax {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct PmAdd {
    template <class T>
    __device__ T operator()(T a, T b) const { return a + b; }
};

// The block's reduction by `op` of every thread's x, returned to every thread; `red` holds
// PM_WARPS values in shared memory. Every thread of the block calls it.
template <class T, class Op>
__device__ __forceinline__ T pm_block_reduce(T x, T* red, Op op) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = op(x, __shfl_xor_sync(0xffffffffu, x, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
    __syncthreads();
    x = red[0];
    for (int w = 1; w < PM_WARPS; w++) x = op(x, red[w]);
    __syncthreads();
    return x;
}

// PM_MMA (set by the host, which sizes the grid by it): keys scored on the tensor cores.
#if PM_MMA && !MMA_KEYS && defined(__CUDA_ARCH__)
#error "PM_MMA needs mma_keys.cu's geometry and compute capability"
#endif

// A page's largest logit `m` for query head g of row r, and its tokens' sum of exp(logit - m):
// zero for a page of no tokens (m minus infinity, the sum NaN), which a table never holds.
__device__ __forceinline__ void pm_put(float* __restrict__ page_max, float* __restrict__ raw,
                                       int r, int g, int stride, int page, float m, float sum) {
    const size_t at = ((size_t)r * GROUP + g) * stride + page;
    page_max[at] = m;
    raw[at] = m == PM_NEG_INF ? 0.f : sum;
}

#if PM_MMA
// The block's pages [p0, p0 + pc) of a row on the tensor cores: warp w takes pages p0 + w,
// + PM_WARPS, ..., loading each one's keys while it scores the one before.
__device__ __forceinline__ void pm_mma_pages(const uint4* __restrict__ kpool,
                                             const unsigned int* __restrict__ ids, int pages,
                                             int last, const float* __restrict__ qrow,
                                             int kv_heads, int h, float scale, int r, int p0,
                                             int pc, int stride, float* __restrict__ page_max,
                                             float* __restrict__ raw) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    unsigned int qa[MMA_CHUNKS][4];
    const float down =
        query_operand(qrow + (size_t)g * HEAD_DIM + LANE_DIMS * t, g < GROUP, scale, qa);
    const int end = p0 + pc;
    auto base = [&](unsigned int id) {
        return ((size_t)id * kv_heads + h) * (PAGE_SIZE * ROW_V);
    };
    auto valid = [&](int p) { return p == pages - 1 ? last : PAGE_SIZE; };
    int p = p0 + warp;
    uint4 cur[2 * K_V];
    unsigned int next = p + PM_WARPS < end ? ids[p + PM_WARPS] : 0u;
    if (p < end) mma_load_keys(kpool, base(ids[p]), g, t, valid(p), cur);
    for (; p < end; p += PM_WARPS) {
        uint4 nxt[2 * K_V];
        const int pn = p + PM_WARPS;
        if (pn < end) {
            mma_load_keys(kpool, base(next), g, t, valid(pn), nxt);
            if (pn + PM_WARPS < end) next = ids[pn + PM_WARPS];
        }
        float s[2][2];
        mma_page_scores(cur, qa, down, t, valid(p), s);
        float m = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
        m = fmaxf(m, __shfl_xor_sync(MMA_FULL, m, 1));
        m = fmaxf(m, __shfl_xor_sync(MMA_FULL, m, 2));
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 2; j++) sum += __expf(s[i][j] - m);
        sum += __shfl_xor_sync(MMA_FULL, sum, 1);
        sum += __shfl_xor_sync(MMA_FULL, sum, 2);
        if (t == 0 && g < GROUP) pm_put(page_max, raw, r, g, stride, p, m, sum);
#pragma unroll
        for (int i = 0; i < 2 * K_V; i++) cur[i] = nxt[i];
    }
}
#endif

// Grid (rows, chunks): rows first_row + r of `rows`, pages [c CHUNK_PAGES, (c + 1) CHUNK_PAGES)
// of each. Writes, for each query head g and page p of the chunk, `page_max[(r * GROUP + g) *
// stride + p]` and `raw[(r * GROUP + g) * stride + p]` (pm_put).
extern "C" __global__ void __launch_bounds__(PM_THREADS)
page_mass_part(const kv_t* __restrict__ kpool, const unsigned int* __restrict__ indptr,
               const unsigned int* __restrict__ indices,
               const unsigned int* __restrict__ last_len, const float* __restrict__ q,
               const unsigned int* __restrict__ rows, int first_row, int kv_heads, float scale,
               int stride, float* __restrict__ page_max, float* __restrict__ raw) {
    const int r = blockIdx.x, c = blockIdx.y;
    const unsigned int* row = rows + PM_ROW * (first_row + r);
    const unsigned int seq = row[0], h = row[1];
    const int first = (int)indptr[seq], pages = (int)indptr[seq + 1] - first;
    const int p0 = c * CHUNK_PAGES;
    if (p0 >= pages) return;
    const int pc = min(CHUNK_PAGES, pages - p0);
    const int last = (int)last_len[seq];
    const float* qrow = q + ((size_t)seq * kv_heads * GROUP + (size_t)h * GROUP) * HEAD_DIM;
#if PM_MMA
    pm_mma_pages(reinterpret_cast<const uint4*>(kpool), indices + first, pages, last, qrow,
                 kv_heads, (int)h, scale, r, p0, pc, stride, page_max, raw);
#else
    __shared__ float qs[GROUP][HEAD_DIM];
    __shared__ float logits[GROUP][PM_CHUNK];
    for (int i = threadIdx.x; i < GROUP * HEAD_DIM; i += PM_THREADS)
        qs[i / HEAD_DIM][i % HEAD_DIM] = qrow[i];
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sub = lane % PM_LANES, per_warp = 32 / PM_LANES;
#if PM_Q_REGS
    float qr[PM_VPL][GROUP][8];
#pragma unroll
    for (int i = 0; i < PM_VPL; i++)
#pragma unroll
        for (int g = 0; g < GROUP; g++)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int v = sub + i * PM_LANES;
                qr[i][g][j] = v < PM_VECS ? qs[g][8 * v + j] : 0.f;
            }
#define PM_Q(i, g, v, j) qr[i][g][j]
#else
#define PM_Q(i, g, v, j) qs[g][8 * (v) + (j)]
#endif
    const int tokens = pc * PAGE_SIZE;
    // PM_UNROLL tokens a lane group at once, their keys' loads in flight together.
    const int step = PM_WARPS * per_warp;
    for (int t0 = warp * per_warp; t0 < tokens; t0 += PM_UNROLL * step) {
        kv_vec kk[PM_UNROLL][PM_VPL];
        bool valid[PM_UNROLL];
#pragma unroll
        for (int u = 0; u < PM_UNROLL; u++) {
            const int t = t0 + u * step + lane / PM_LANES;
            const int p = p0 + t / PAGE_SIZE, slot = t % PAGE_SIZE;
            valid[u] = t < tokens && (p + 1 < pages || slot < last);
            const kv_vec* k = reinterpret_cast<const kv_vec*>(
                kpool + (((size_t)(valid[u] ? indices[first + p] : 0u) * kv_heads + h) *
                             PAGE_SIZE + slot) * HEAD_DIM);
#pragma unroll
            for (int i = 0; i < PM_VPL; i++) {
                const int v = sub + i * PM_LANES;
                kk[u][i] = valid[u] && v < PM_VECS ? k[v] : kv_zero();
            }
        }
#pragma unroll
        for (int u = 0; u < PM_UNROLL; u++) {
            float dot[GROUP];
#pragma unroll
            for (int g = 0; g < GROUP; g++) dot[g] = 0.f;
#pragma unroll
            for (int i = 0; i < PM_VPL; i++) {
                const int v = sub + i * PM_LANES;
                if (v >= PM_VECS) continue;
                float f[8];
                kv_unpack8(kk[u][i], f);
#pragma unroll
                for (int g = 0; g < GROUP; g++)
#pragma unroll
                    for (int j = 0; j < 8; j++) dot[g] = fmaf(PM_Q(i, g, v, j), f[j], dot[g]);
            }
#pragma unroll
            for (int g = 0; g < GROUP; g++) {
#pragma unroll
                for (int o = PM_LANES / 2; o > 0; o >>= 1)
                    dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], o);
            }
            const int t = t0 + u * step + lane / PM_LANES;
            if (sub == 0 && t < tokens) {
#pragma unroll
                for (int g = 0; g < GROUP; g++)
                    logits[g][t] = valid[u] ? dot[g] * scale : PM_NEG_INF;
            }
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < GROUP * pc; i += PM_THREADS) {
        const int g = i / pc, p = i % pc;
        const float* lg = logits[g] + p * PAGE_SIZE;
        float m = PM_NEG_INF;
        for (int t = 0; t < PAGE_SIZE; t++) m = fmaxf(m, lg[t]);
        float sum = 0.f;
        for (int t = 0; t < PAGE_SIZE; t++) sum += __expf(lg[t] - m);
        pm_put(page_max, raw, r, g, stride, p0 + p, m, sum);
    }
#endif
}

// One block a row (row first_row + r of `rows`): `mass[r * stride + page]`, the page's share
// of each head's attention summed over the group (a row's masses add up to GROUP).
extern "C" __global__ void __launch_bounds__(PM_THREADS)
page_mass_sum(const unsigned int* __restrict__ indptr, const unsigned int* __restrict__ rows,
              int first_row, const float* __restrict__ page_max, const float* __restrict__ raw,
              int stride, float* __restrict__ mass) {
    __shared__ float red[PM_WARPS];
    const int r = blockIdx.x;
    const unsigned int seq = rows[PM_ROW * (first_row + r)];
    const int pages = (int)(indptr[seq + 1] - indptr[seq]);
    float* out = mass + (size_t)r * stride;
    for (int g = 0; g < GROUP; g++) {
        const float* pm = page_max + ((size_t)r * GROUP + g) * stride;
        const float* rw = raw + ((size_t)r * GROUP + g) * stride;
        float m = PM_NEG_INF;
        for (int p = threadIdx.x; p < pages; p += PM_THREADS) m = fmaxf(m, pm[p]);
        m = pm_block_reduce(m, red, PmMax());
        float z = 0.f;
        for (int p = threadIdx.x; p < pages; p += PM_THREADS) z += rw[p] * __expf(pm[p] - m);
        z = pm_block_reduce(z, red, PmAdd());
        const float inv = 1.f / z;
        for (int p = threadIdx.x; p < pages; p += PM_THREADS) {
            const float share = rw[p] * __expf(pm[p] - m) * inv;
            out[p] = g == 0 ? share : out[p] + share;
        }
    }
}

// The kept pages' ids in a shared hash set (open addressing, half full at most) when there are
// at most PM_HASH_KEPT of them; more are searched in device memory, slowly.
#define PM_HASH_SLOTS 2048
#define PM_HASH_KEPT 1024
#define PM_EMPTY 0xffffffffu  // no page has this id: a GPU pool holds at most 2^31 - 1 pages

__device__ __forceinline__ unsigned int pm_slot(unsigned int id) {
    return (id * 0x9e3779b1u) >> (32 - 11);
}

// One block a row (row i = first_row + r of `rows`, its masses at `mass[r * stride]`):
// `recall[2 i]` the exact mass on the pages it kept (averaged over the group's query heads),
// `recall[2 i + 1]` the share of the k pages of most mass (ties to the earlier page; k the
// pages kept) that it kept.
extern "C" __global__ void __launch_bounds__(PM_THREADS)
page_mass_recall(const unsigned int* __restrict__ indptr, const unsigned int* __restrict__ indices,
                 const unsigned int* __restrict__ rows, int first_row,
                 const float* __restrict__ mass, int stride,
                 const unsigned int* __restrict__ sparse, float* __restrict__ recall) {
    static_assert(PM_HASH_SLOTS == 1 << 11, "pm_slot takes 11 bits");
    __shared__ float sh_mass[PM_SHARED_PAGES];
    __shared__ unsigned int kept_set[PM_HASH_SLOTS];
    __shared__ int hist[256];
    __shared__ float red[PM_WARPS];
    __shared__ int counts[PM_WARPS];
    __shared__ unsigned int digit_at;
    __shared__ int above_digit;
    const int r = blockIdx.x;
    const unsigned int* row = rows + PM_ROW * (first_row + r);
    const unsigned int seq = row[0];
    const int kept_n = (int)row[3];
    const unsigned int* ids = indices + indptr[seq];
    const int pages = (int)(indptr[seq + 1] - indptr[seq]);
    const float* m = mass + (size_t)r * stride;
    const unsigned int* kept = sparse + row[2];
    const bool hashed = kept_n <= PM_HASH_KEPT;
    if (pages <= PM_SHARED_PAGES) {
        for (int p = threadIdx.x; p < pages; p += PM_THREADS) sh_mass[p] = m[p];
        m = sh_mass;
    }
    if (hashed) {
        for (int j = threadIdx.x; j < PM_HASH_SLOTS; j += PM_THREADS) kept_set[j] = PM_EMPTY;
        __syncthreads();
        for (int j = threadIdx.x; j < kept_n; j += PM_THREADS) {
            const unsigned int id = kept[j];
            for (unsigned int slot = pm_slot(id);; slot = (slot + 1) & (PM_HASH_SLOTS - 1)) {
                const unsigned int was = atomicCAS(&kept_set[slot], PM_EMPTY, id);
                if (was == PM_EMPTY || was == id) break;
            }
        }
    }
    __syncthreads();
    auto is_kept = [&](int p) {
        const unsigned int id = ids[p];
        if (hashed) {
            for (unsigned int slot = pm_slot(id);; slot = (slot + 1) & (PM_HASH_SLOTS - 1)) {
                const unsigned int x = kept_set[slot];
                if (x == id) return true;
                if (x == PM_EMPTY) return false;
            }
        }
        bool found = false;
        for (int j = 0; j < kept_n; j++) found |= kept[j] == id;
        return found;
    };
    int k = 0;
    float on_kept = 0.f;
    for (int p = threadIdx.x; p < pages; p += PM_THREADS) {
        if (is_kept(p)) {
            k++;
            on_kept += m[p];
        }
    }
    k = pm_block_reduce(k, counts, PmAdd());
    on_kept = pm_block_reduce(on_kept, red, PmAdd());
    // The top k in (mass descending, page ascending): the pages above the k-th largest mass,
    // then those at it by page. Masses are not negative, so their bits order as they do: the
    // k-th largest's bits are found a byte at a time, from the top, by a histogram of the
    // pages that share the bytes found so far.
    unsigned int kth = 0u;
    int above = 0;  // pages whose mass is above kth's bits
    for (int shift = 24; shift >= 0 && k > 0; shift -= 8) {
        const unsigned int high = shift == 24 ? 0u : ~0u << (shift + 8);
        for (int b = threadIdx.x; b < 256; b += PM_THREADS) hist[b] = 0;
        __syncthreads();
        for (int p = threadIdx.x; p < pages; p += PM_THREADS) {
            const unsigned int x = __float_as_uint(m[p]);
            if ((x & high) == kth) atomicAdd(&hist[(x >> shift) & 0xffu], 1);
        }
        __syncthreads();
        // One warp finds the byte: lane l sums bytes 255 - 8 l down to 248 - 8 l, the lanes
        // scan from the top, and the lane where the count reaches k - above picks its byte.
        if (threadIdx.x < 32) {
            const int lane = threadIdx.x, top = 255 - 8 * lane;
            int own = 0;
            for (int b = 0; b < 8; b++) own += hist[top - b];
            int incl = own;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int y = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += y;
            }
            const int need = k - above, before = incl - own;
            if (before < need && need <= incl) {
                int c = before;
                for (int b = 0; b < 8; b++) {
                    const int h = hist[top - b];
                    if (c + h >= need) {
                        digit_at = (unsigned int)(top - b);
                        above_digit = c;
                        break;
                    }
                    c += h;
                }
            }
        }
        __syncthreads();
        kth |= digit_at << shift;
        above += above_digit;
    }
    // A page at the k-th largest mass is among the top k when fewer than k - above pages at it
    // come before it: the block counts them round by round (a serial count by each such page
    // bounded the kernel).
    float hits = 0.f;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int ties_before = 0;
    for (int p0 = 0; p0 < pages && k > 0; p0 += PM_THREADS) {
        const int p = p0 + threadIdx.x;
        const unsigned int x = p < pages ? __float_as_uint(m[p]) : 0u;
        const unsigned int tied = __ballot_sync(0xffffffffu, p < pages && x == kth);
        if (lane == 0) counts[warp] = __popc(tied);
        __syncthreads();
        int rank = ties_before + __popc(tied & ((1u << lane) - 1u));
        for (int w = 0; w < PM_WARPS; w++) {
            rank += w < warp ? counts[w] : 0;
            ties_before += counts[w];
        }
        __syncthreads();
        if (p < pages && x >= kth && (x > kth || above + rank < k) && is_kept(p)) hits += 1.f;
    }
    hits = pm_block_reduce(hits, red, PmAdd());
    if (threadIdx.x == 0) {
        recall[2 * (first_row + r)] = on_kept / (float)GROUP;
        recall[2 * (first_row + r) + 1] = k > 0 ? hits / (float)k : 0.f;
    }
}
