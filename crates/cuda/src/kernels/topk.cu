// Block-wide top-k over keys held in shared memory, one block per row: exact (radix digits over
// the span of the row's keys, refined until one key value or the whole threshold bin is taken) or
// approximate (a first histogram linear in the score values, refined only while the recall bound
// is not met; the rest is taken evenly from the threshold bin, as the CPU's approximate top-k).

#define TOPK_THREADS 512
#define TK_BINS 2048
#define TK_WARPS (TOPK_THREADS / 32)
#define TK_FULL 0xffffffffu

struct TopkShared {
    unsigned int hist[TK_BINS];
    int warp_sums[TK_WARPS];
    unsigned int lo, hi;
    int above, count, bin;
};

// Unsigned keys that order as the floats do; NaN ranks below -inf.
__device__ __forceinline__ unsigned int tk_key(float x) {
    const unsigned int b = __float_as_uint(x);
    const unsigned int key = b ^ ((unsigned int)((int)b >> 31) | 0x80000000u);
    return x != x ? 0u : key;
}

__device__ __forceinline__ float tk_value(unsigned int key) {
    return __uint_as_float((key & 0x80000000u) ? (key ^ 0x80000000u) : ~key);
}

// Exclusive prefix sum over the block; `total` gets the block's sum.
__device__ __forceinline__ int tk_scan(TopkShared& s, int v, int* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(TK_FULL, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) s.warp_sums[warp] = x;
    __syncthreads();
    int before = 0, all = 0;
#pragma unroll
    for (int w = 0; w < TK_WARPS; w++) {
        const int ws = s.warp_sums[w];
        before += w < warp ? ws : 0;
        all += ws;
    }
    __syncthreads();
    *total = all;
    return before + x - v;
}

// The smallest and largest of each thread's `lo`, `hi`, left in s.lo and s.hi.
__device__ __forceinline__ void tk_span(TopkShared& s, unsigned int lo, unsigned int hi) {
    lo = __reduce_min_sync(TK_FULL, lo);
    hi = __reduce_max_sync(TK_FULL, hi);
    if (threadIdx.x == 0) {
        s.lo = 0xffffffffu;
        s.hi = 0u;
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) {
        atomicMin(&s.lo, lo);
        atomicMax(&s.hi, hi);
    }
    __syncthreads();
}

__device__ __forceinline__ int tk_linear_bin(unsigned int key, float xlo, float scale) {
    return min(TK_BINS - 1, (int)((tk_value(key) - xlo) * scale));
}

// Top `k` (1 <= k <= n) of `keys[0..n)`: calls emit(pos, i) for each kept index, positions
// 0..k in ascending index order. `required >= k`: exact, ties to the lower index. Otherwise at
// least `required` of the kept are in the exact top-k.
template <class Emit>
__device__ void tk_select(TopkShared& s, const unsigned int* keys, int n, int k, int required,
                          Emit emit) {
    const int tid = threadIdx.x;
    const bool exact = required >= k;
    unsigned int l = 0xffffffffu, h = 0u;
    for (int i = tid; i < n; i += TOPK_THREADS) {
        l = min(l, keys[i]);
        h = max(h, keys[i]);
    }
    tk_span(s, l, h);
    // Invariant: `above` keys lie above [lo, hi], `count` keys within it, `k - above` of them kept.
    unsigned int lo = s.lo, hi = s.hi;
    int above = 0, count = n;
    bool try_linear = !exact;
    for (int pass = 0; pass < 6; pass++) {
        const int left = k - above;
        if (count == left || lo == hi) break;
        if (!exact && above + max(0, 2 * left - count) >= required) break;
        const float xlo = tk_value(lo), xhi = tk_value(hi);
        float scale = 0.f;
        bool lin = try_linear && isfinite(xlo) && isfinite(xhi) && xhi > xlo;
        if (lin) {
            scale = (float)TK_BINS / (xhi - xlo);
            lin = isfinite(scale) && scale > 0.f;
        }
        try_linear = false;
        const unsigned int span = hi - lo;
        const int shift = max(0, 32 - __clz((int)span) - 11);
        for (int b = tid; b < TK_BINS; b += TOPK_THREADS) s.hist[b] = 0u;
        __syncthreads();
        for (int i = tid; i < n; i += TOPK_THREADS) {
            const unsigned int key = keys[i];
            if (key < lo || key > hi) continue;
            const int b = lin ? tk_linear_bin(key, xlo, scale) : (int)((key - lo) >> shift);
            atomicAdd(&s.hist[b], 1u);
        }
        __syncthreads();
        // The bin holding the left-th largest key, counting down from the top bin.
        constexpr int PER = TK_BINS / TOPK_THREADS;
        const int top = TK_BINS - 1 - tid * PER;
        int c = 0;
#pragma unroll
        for (int j = 0; j < PER; j++) c += (int)s.hist[top - j];
        int all;
        const int before = tk_scan(s, c, &all);
        if (before < left && before + c >= left) {
            int acc = before;
#pragma unroll
            for (int j = 0; j < PER; j++) {
                const int cj = (int)s.hist[top - j];
                if (acc + cj >= left) {
                    s.bin = top - j;
                    s.above = acc;
                    s.count = cj;
                    break;
                }
                acc += cj;
            }
        }
        __syncthreads();
        const int bin = s.bin;
        above += s.above;
        count = s.count;
        if (lin) {
            // The bin's keys are one interval (the bin is monotone in the key): find its ends.
            unsigned int l2 = 0xffffffffu, h2 = 0u;
            for (int i = tid; i < n; i += TOPK_THREADS) {
                const unsigned int key = keys[i];
                if (key >= lo && key <= hi && tk_linear_bin(key, xlo, scale) == bin) {
                    l2 = min(l2, key);
                    h2 = max(h2, key);
                }
            }
            tk_span(s, l2, h2);
            lo = s.lo;
            hi = s.hi;
        } else {
            const unsigned int first = lo + ((unsigned int)bin << shift);
            const unsigned long long last = (unsigned long long)first + (1ull << shift) - 1ull;
            lo = first;
            hi = last < (unsigned long long)hi ? (unsigned int)last : hi;
        }
        __syncthreads();
    }
    // Keys above the interval are kept; `left` of its `count` keys, in index order: the first
    // ones when exact or all equal, else spread evenly over them. Each warp walks a contiguous
    // chunk of the row, 32 keys at a time, ranking with ballots.
    const int left = k - above;
    const bool even = !exact && lo != hi;
    const int lane = tid & 31;
    const unsigned int lt = (1u << lane) - 1u;
    const int per = (n + TK_WARPS - 1) / TK_WARPS;
    const int wb = min(n, (tid >> 5) * per), we = min(n, wb + per);
    int m = 0;
    for (int base = wb; base < we; base += 32) {
        const int i = base + lane;
        const unsigned int key = i < we ? keys[i] : 0u;
        m += __popc(__ballot_sync(TK_FULL, i < we && key >= lo && key <= hi));
    }
    int total;
    const int m_before = __shfl_sync(TK_FULL, tk_scan(s, lane == 0 ? m : 0, &total), 0);
    auto walk = [&](int pos, bool write) {
        int r = m_before, kept = 0;
        for (int base = wb; base < we; base += 32) {
            const int i = base + lane;
            const unsigned int key = i < we ? keys[i] : 0u;
            const bool member = i < we && key >= lo && key <= hi;
            const unsigned int mb = __ballot_sync(TK_FULL, member);
            const int rank = r + __popc(mb & lt);
            bool keep = i < we && key > hi;
            if (member) {
                // n k < 2^32: the products fit unsigned 32-bit arithmetic.
                const unsigned int ur = (unsigned int)rank, ul = (unsigned int)left;
                keep = even ? (ur + 1u) * ul / (unsigned int)count > ur * ul / (unsigned int)count
                            : rank < left;
            }
            const unsigned int kb = __ballot_sync(TK_FULL, keep);
            if (write && keep) emit(pos + kept + __popc(kb & lt), i);
            kept += __popc(kb);
            r += __popc(mb);
        }
        return kept;
    };
    const int kc = walk(0, false);
    const int k_before = __shfl_sync(TK_FULL, tk_scan(s, lane == 0 ? kc : 0, &total), 0);
    walk(k_before, true);
}

// Top-k of each row of `scores` ([rows][n], one block per row, n keys of dynamic shared
// memory): `out[row][0..k)` the kept indices in ascending order.
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
topk_rows(const float* __restrict__ scores, int n, int k, int required,
          unsigned int* __restrict__ out) {
    extern __shared__ unsigned int tk_keys[];
    __shared__ TopkShared s;
    const float* row = scores + (size_t)blockIdx.x * n;
    if ((n & 3) == 0) {
        // 16-byte loads, four per thread in flight: one round trip per 32 KiB of the row.
        const float4* row4 = reinterpret_cast<const float4*>(row);
        uint4* keys4 = reinterpret_cast<uint4*>(tk_keys);
        const int n4 = n >> 2;
        for (int base = threadIdx.x; base < n4; base += 4 * TOPK_THREADS) {
            float4 v[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int j = base + u * TOPK_THREADS;
                if (j < n4) v[u] = __ldg(row4 + j);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int j = base + u * TOPK_THREADS;
                if (j < n4)
                    keys4[j] = make_uint4(tk_key(v[u].x), tk_key(v[u].y), tk_key(v[u].z),
                                          tk_key(v[u].w));
            }
        }
    } else {
        for (int i = threadIdx.x; i < n; i += TOPK_THREADS) tk_keys[i] = tk_key(row[i]);
    }
    __syncthreads();
    unsigned int* dst = out + (size_t)blockIdx.x * k;
    tk_select(s, tk_keys, n, k, required, [&](int pos, int i) { dst[pos] = (unsigned int)i; });
}
