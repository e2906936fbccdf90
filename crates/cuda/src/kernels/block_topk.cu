// Block top-k index phase: page scores from mean-key centroids, then an exact top-k per
// (sequence, KV head) that writes the sparse page table. Defines: HEAD_DIM, GROUP.
//
// Centroids are bf16, laid out as the CPU's page fields: [kv_head][pool page][HEAD_DIM].
// A page's score is the best over the group's query heads of q . centroid (no scale).

#define LPT (HEAD_DIM / 8)
#define TPL (32 / LPT)
#define ROW_VEC (HEAD_DIM / 8)
#define FULL 0xffffffffu
#define SCORE_WARPS 4
#define PAGES_PER_WARP 32
#define SEL_THREADS 1024

// One row of selection: the pages `first..first + pages` of the dense table are the sequence's
// logical pages; pages `sinks..pages - recent` are candidates, `k` of them are kept.
struct __align__(16) SelRow {
    int seq, head, pages, sinks;
    int recent, k, out, score_off;  // out: first slot in the sparse indices; scores of candidates
};

__device__ __forceinline__ unsigned int order_key(float x) {
    const unsigned int b = __float_as_uint(x);
    const unsigned int key = b ^ ((unsigned int)((int)b >> 31) | 0x80000000u);
    return x != x ? 0u : key;  // NaN ranks below -inf
}

// grid: (ceil(max candidates / (SCORE_WARPS * PAGES_PER_WARP)), rows); block: SCORE_WARPS warps.
extern "C" __global__ void __launch_bounds__(SCORE_WARPS * 32)
centroid_scores(const uint4* __restrict__ centroids, int num_pages,
                const unsigned int* __restrict__ dense_indptr,
                const unsigned int* __restrict__ dense_indices, const float* __restrict__ q,
                const SelRow* __restrict__ rows, int kv_heads, float* __restrict__ scores) {
    const SelRow r = rows[blockIdx.y];
    const int n = r.pages - r.sinks - r.recent;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int tg = lane / LPT, dl = lane % LPT;
    const int begin = (blockIdx.x * SCORE_WARPS + warp) * PAGES_PER_WARP;
    if (r.k <= 0 || begin >= n) return;
    float qr[GROUP][8];
    const float* qg = q + ((size_t)r.seq * kv_heads + r.head) * GROUP * HEAD_DIM + dl * 8;
#pragma unroll
    for (int h = 0; h < GROUP; h++)
#pragma unroll
        for (int j = 0; j < 8; j++) qr[h][j] = qg[h * HEAD_DIM + j];
    const unsigned int* logical = dense_indices + dense_indptr[r.seq] + r.sinks;
    const uint4* base = centroids + (size_t)r.head * num_pages * ROW_VEC + dl;
    const int end = min(n, begin + PAGES_PER_WARP);
    // All of the warp's centroid loads first, then the arithmetic: many loads in flight.
    uint4 c[PAGES_PER_WARP / TPL];
#pragma unroll
    for (int t = 0; t < PAGES_PER_WARP / TPL; t++) {
        const int i = begin + t * TPL + tg;
        c[t] = i < end ? __ldg(base + (size_t)logical[i] * ROW_VEC) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int t = 0; t < PAGES_PER_WARP / TPL; t++) {
        const int i = begin + t * TPL + tg;
        const unsigned int w[4] = {c[t].x, c[t].y, c[t].z, c[t].w};
        float best = __int_as_float(0xff800000);
#pragma unroll
        for (int h = 0; h < GROUP; h++) {
            float a = 0.f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                a = fmaf(qr[h][2 * j], __uint_as_float(w[j] << 16), a);
                a = fmaf(qr[h][2 * j + 1], __uint_as_float(w[j] & 0xffff0000u), a);
            }
#pragma unroll
            for (int o = LPT / 2; o > 0; o >>= 1) a += __shfl_xor_sync(FULL, a, o);
            best = fmaxf(best, a);
        }
        if (i < end && dl == 0) scores[r.score_off + i] = best;
    }
}

// Exclusive prefix sum over the block (SEL_THREADS threads); `total` gets the block's sum.
__device__ __forceinline__ int block_scan(int v, int* total) {
    __shared__ int warp_sums[SEL_THREADS / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(FULL, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    int before = 0, all = 0;
#pragma unroll
    for (int w = 0; w < SEL_THREADS / 32; w++) {
        before += w < warp ? warp_sums[w] : 0;
        all += warp_sums[w];
    }
    __syncthreads();
    *total = all;
    return before + x - v;
}

// One block per row: exact top-k of the candidates' scores (ties: the lower page wins), then
// sinks, the kept candidates and the recent pages, in sequence order, as physical pages.
extern "C" __global__ void __launch_bounds__(SEL_THREADS)
select_pages(const float* __restrict__ scores, const unsigned int* __restrict__ dense_indptr,
             const unsigned int* __restrict__ dense_indices, const SelRow* __restrict__ rows,
             unsigned int* __restrict__ out) {
    __shared__ unsigned int hist[256];
    __shared__ unsigned int sm_digit, sm_left;
    const SelRow r = rows[blockIdx.x];
    const unsigned int* logical = dense_indices + dense_indptr[r.seq];
    unsigned int* dst = out + r.out;
    for (int j = threadIdx.x; j < r.sinks; j += SEL_THREADS) dst[j] = logical[j];
    for (int j = threadIdx.x; j < r.recent; j += SEL_THREADS)
        dst[r.sinks + r.k + j] = logical[r.pages - r.recent + j];
    const int n = r.pages - r.sinks - r.recent;
    if (r.k <= 0) return;
    const float* sc = scores + r.score_off;
    // Radix select of the k-th largest key, 8 bits at a time from the top.
    unsigned int prefix = 0, mask = 0, left = (unsigned int)r.k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int d = threadIdx.x; d < 256; d += SEL_THREADS) hist[d] = 0;
        __syncthreads();
        for (int base = 0; base < n; base += SEL_THREADS) {
            const int i = base + threadIdx.x;
            const unsigned int key = i < n ? order_key(sc[i]) : 0u;
            const bool hit = i < n && (key & mask) == prefix;
            // Lanes that hit the same bin add once, through their lowest lane.
            const unsigned int bin = hit ? (key >> shift) & 255u : 256u;
            const unsigned int same = __match_any_sync(FULL, bin);
            if (hit && (threadIdx.x & 31) == __ffs(same) - 1) atomicAdd(&hist[bin], __popc(same));
        }
        __syncthreads();
        // The bin holding the left-th largest key: bins above it hold fewer than `left` keys.
        int count = 0;
        const int d = 255 - (int)threadIdx.x;  // one bin per thread of the first 256
        if (d >= 0) count = hist[d];
        int all;
        const int above = block_scan(count, &all);
        if (above < (int)left && above + count >= (int)left) {
            sm_digit = (unsigned int)d;
            sm_left = left - above;
        }
        __syncthreads();
        prefix |= sm_digit << shift;
        mask |= 255u << shift;
        left = sm_left;
        __syncthreads();
    }
    // Keep keys above the threshold and the first `left` keys equal to it, in page order.
    int taken = 0, ties = 0;
    for (int base = 0; base < n; base += SEL_THREADS) {
        const int i = base + threadIdx.x;
        const unsigned int key = i < n ? order_key(sc[i]) : 0u;
        const int eq = i < n && key == prefix;
        int eq_total;
        const int eq_rank = ties + block_scan(eq, &eq_total);
        const int keep = i < n && (key > prefix || (eq && eq_rank < (int)left));
        int keep_total;
        const int pos = taken + block_scan(keep, &keep_total);
        if (keep) dst[r.sinks + pos] = logical[r.sinks + i];
        taken += keep_total;
        ties += eq_total;
    }
}
