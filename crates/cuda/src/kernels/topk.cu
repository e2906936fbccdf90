// Block-wide top-k over keys held in shared memory, one block per row. A first histogram is
// linear in the score values over the row's span; the threshold bin is then refined by radix
// digits of the keys. Exact: until one key value or the whole bin is taken, or the bin is small
// enough for one warp to rank its keys while the kept are gathered. Approximate: only
// while the recall bound is not met, the rest taken evenly from the threshold bin, as the CPU's
// approximate top-k.

#define TOPK_THREADS 512
#define TK_BINS 2048
#define TK_WARPS (TOPK_THREADS / 32)
#define TK_FULL 0xffffffffu
// Keys each thread loads at once in a pass over the row. More pays for long rows in a kernel of
// their own (topk_rows), but costs the fused index kernels' scoring loops their registers.
#ifndef TK_UNROLL
#define TK_UNROLL 1
#endif
#ifndef TK_LOADS
#define TK_LOADS 8
#endif
// Marks a gathered candidate as within the threshold interval (indices stay below 2^31).
#define TK_MEMBER 0x80000000u
// An exact top-k whose threshold interval holds at most this many keys ranks them in one warp
// instead of another histogram pass.
#define TK_SMALL 32

struct TopkShared {
    unsigned int hist[TK_BINS];
    int warp_sums[TK_WARPS];
    unsigned int lo, hi;
    int above, count, bin;
    // The interval's keys and indices when it is small, and which of them (bit: rank in index
    // order) are kept.
    unsigned int small_key[TK_SMALL], small_idx[TK_SMALL];
    int small_n;
    unsigned int small_kept;
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

// 1.5 * 2^23: a float near it holds the integer it rounds to in its low mantissa bits.
#define TK_ROUND 12582912.0f

// Bin of `key` among TK_BINS linear in the value, value * scale + c - TK_ROUND rounded (c =
// TK_ROUND - xlo * scale): monotone in the key, and no float-to-integer conversion, which runs
// at a quarter of the integer rate.
__device__ __forceinline__ int tk_linear_bin(unsigned int key, float c, float scale) {
    const int b = __float_as_int(fmaf(tk_value(key), scale, c)) - __float_as_int(TK_ROUND);
    return min(TK_BINS - 1, max(0, b));
}

// Warp-wide: the smallest key in [lo, hi + 1] whose linear bin is at least `bin` (hi + 1 when
// none is). The bins are monotone in the key, so a bin's keys are one interval, found by a
// 32-way search instead of another pass over the row.
__device__ __forceinline__ unsigned long long tk_bin_start(unsigned int lo, unsigned int hi,
                                                           float c, float scale, int bin) {
    const unsigned long long lane = threadIdx.x & 31;
    // Every key below `a` has a lower bin; `b` has at least `bin` (or is hi + 1).
    unsigned long long a = lo, b = (unsigned long long)hi + 1ull;
    // First the 32 keys around the bin's edge in value (bins round to nearest, so it lies half a
    // bin below), which hold the answer unless rounding moved it further.
    const unsigned long long guess = tk_key(((float)bin - 0.5f - (c - TK_ROUND)) / scale),
                             w = guess - 16ull + lane;
    if (guess >= a + 16ull && guess + 16ull <= b) {
        const unsigned int ballot =
            __ballot_sync(TK_FULL, tk_linear_bin((unsigned int)w, c, scale) >= bin);
        if (ballot != 0u && ballot != TK_FULL)
            return guess - 16ull + (unsigned long long)(__ffs(ballot) - 1);
        if (ballot == TK_FULL) b = guess - 16ull;
        else a = guess + 16ull;
    }
    while (a < b) {
        const unsigned long long step = (b - a + 31ull) >> 5, x = a + lane * step;
        const bool at = x >= b || tk_linear_bin((unsigned int)x, c, scale) >= bin;
        const unsigned int ballot = __ballot_sync(TK_FULL, at);
        const unsigned long long f = ballot ? (unsigned long long)(__ffs(ballot) - 1) : 32ull;
        if (f == 0) return a;
        if (f < 32) b = min(b, a + f * step);
        a += (f - 1) * step + 1ull;
    }
    return a;
}

// Top `k` (1 <= k <= n) of `keys[0..n)` (which it overwrites), whose smallest and largest are
// `lo` and `hi`: calls emit(pos, i) for each kept index, positions 0..k in ascending index
// order. `required >= k`: exact, ties to the lower index. Otherwise at least `required` of the
// kept are in the exact top-k.
template <class Emit>
__device__ void tk_select_within(TopkShared& s, unsigned int* keys, int n, int k,
                                 int required, unsigned int lo, unsigned int hi, Emit emit) {
    const int tid = threadIdx.x;
    const bool exact = required >= k;
    // Invariant: `above` keys lie above [lo, hi], `count` keys within it, `k - above` of them kept.
    int above = 0, count = n;
    bool linear_first = true, small = false;
    for (int pass = 0; pass < 6; pass++) {
        const int left = k - above;
        if (count == left || lo == hi) break;
        if (!exact && above + max(0, 2 * left - count) >= required) break;
        if (exact && count <= TK_SMALL) {
            small = true;
            break;
        }
        const float xlo = tk_value(lo), xhi = tk_value(hi);
        float scale = 0.f, offset = 0.f;
        bool lin = linear_first && isfinite(xlo) && isfinite(xhi) && xhi > xlo;
        if (lin) {
            scale = (float)TK_BINS / (xhi - xlo);
            offset = TK_ROUND - xlo * scale;
            lin = isfinite(scale) && scale > 0.f && isfinite(offset);
        }
        // A row whose span reaches an infinity or NaN gets its linear pass once radix digits
        // have narrowed the interval to finite values.
        if (lin) linear_first = false;
        const unsigned int span = hi - lo;
        const int shift = max(0, 32 - __clz((int)span) - 11);
        for (int b = tid; b < TK_BINS; b += TOPK_THREADS) s.hist[b] = 0u;
        __syncthreads();
        for (int base = 0; base < n; base += TK_UNROLL * TOPK_THREADS) {
            unsigned int kk[TK_UNROLL];
#pragma unroll
            for (int u = 0; u < TK_UNROLL; u++) {
                const int i = base + u * TOPK_THREADS + tid;
                kk[u] = i < n ? keys[i] : 0u;
            }
#pragma unroll
            for (int u = 0; u < TK_UNROLL; u++) {
                const int i = base + u * TOPK_THREADS + tid;
                const unsigned int key = kk[u];
                if (i >= n || key < lo || key > hi) continue;
                const int b = lin ? tk_linear_bin(key, offset, scale) : (int)((key - lo) >> shift);
                atomicAdd(&s.hist[b], 1u);
            }
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
            const int warp = tid >> 5;
            if (warp == 0) {
                const unsigned long long first = tk_bin_start(lo, hi, offset, scale, bin);
                if (tid == 0) s.lo = (unsigned int)first;
            } else if (warp == 1) {
                const unsigned long long next =
                    bin + 1 < TK_BINS ? tk_bin_start(lo, hi, offset, scale, bin + 1)
                                      : (unsigned long long)hi + 1ull;
                if (tid == 32) s.hi = (unsigned int)(next - 1ull);
            }
            __syncthreads();
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
    // ones when exact or all equal, else spread evenly over them (kept_below(r) of the ranks
    // [0, r) kept, floor(r left / count)). Each warp walks a contiguous chunk of the row, 32 keys
    // at a time: once to count and gather the chunk's candidates (the kept and the interval's
    // keys, as index | TK_MEMBER) in order over its own first keys, once over those to emit.
    const int left = k - above;
    const bool even = !exact && lo != hi;
    if (small) {
        if (tid == 0) s.small_n = 0;
        __syncthreads();
    }
    const unsigned int ul = (unsigned int)left, uc = (unsigned int)max(count, 1);
    // floor(x / uc) for x = r left <= n k < 2^32: umulhi by floor((2^32 - 1) / uc) is at most
    // one short.
    const unsigned int inv = even ? 0xffffffffu / uc : 0u;
    auto kept_below = [&](int r) {
        if (!even) return min(r, left);
        const unsigned int x = (unsigned int)r * ul;
        unsigned int q = __umulhi(x, inv);
        if (x - q * uc >= uc) q++;
        return (int)q;
    };
    const int lane = tid & 31, warp = tid >> 5;
    const unsigned int lt = (1u << lane) - 1u;
    const int per = (n + TK_WARPS - 1) / TK_WARPS;
    const int wb = min(n, warp * per), we = min(n, wb + per);
    int a = 0, gathered = 0;
    for (int base = wb; base < we; base += 32 * TK_UNROLL) {
        unsigned int kk[TK_UNROLL];
#pragma unroll
        for (int u = 0; u < TK_UNROLL; u++) {
            const int i = base + 32 * u + lane;
            kk[u] = i < we ? keys[i] : 0u;
        }
        // The warp has read these keys before any candidate is written over them.
        __syncwarp();
#pragma unroll
        for (int u = 0; u < TK_UNROLL; u++) {
            const int i = base + 32 * u + lane;
            const bool up = i < we && kk[u] > hi, member = i < we && kk[u] >= lo && !up;
            const unsigned int cb = __ballot_sync(TK_FULL, up || member);
            if (up || member)
                keys[wb + gathered + __popc(cb & lt)] = (unsigned int)i | (member ? TK_MEMBER : 0u);
            if (small && member) {
                const int slot = atomicAdd(&s.small_n, 1);
                s.small_key[slot] = kk[u];
                s.small_idx[slot] = (unsigned int)i;
            }
            gathered += __popc(cb);
            a += up;
        }
    }
    a = __reduce_add_sync(TK_FULL, a);
    const int m = gathered - a;
    if (lane == 0) {
        s.warp_sums[warp] = a;
        s.hist[warp] = (unsigned int)m;
    }
    __syncthreads();
    int a_before = 0, m_before = 0;
    for (int w = 0; w < warp; w++) {
        a_before += s.warp_sums[w];
        m_before += (int)s.hist[w];
    }
    if (small && warp == 0) {
        // A key's rank: the interval's keys above it, or equal at a lower index; `left` of the
        // best are kept. Its position among them in index order is its bit.
        const bool has = lane < count;
        const unsigned int mk = has ? s.small_key[lane] : 0u;
        const unsigned int mi = has ? s.small_idx[lane] : 0xffffffffu;
        int rank = 0, order = 0;
        for (int j = 0; j < count; j++) {
            const unsigned int kj = __shfl_sync(TK_FULL, mk, j), ij = __shfl_sync(TK_FULL, mi, j);
            rank += kj > mk || (kj == mk && ij < mi);
            order += ij < mi;
        }
        const unsigned int kept = __reduce_or_sync(TK_FULL, has && rank < left ? 1u << order : 0u);
        if (lane == 0) s.small_kept = kept;
    }
    __syncthreads();
    const unsigned int small_kept = s.small_kept;
    const int kept_before =
        small ? __popc((unsigned int)(small_kept & ((1ull << m_before) - 1ull))) : kept_below(m_before);
    int r = m_before, pos = a_before + kept_before;
    for (int base = 0; base < a + m; base += 32) {
        const bool in = base + lane < a + m;
        const unsigned int e = in ? keys[wb + base + lane] : 0u;
        const bool member = in && (e & TK_MEMBER);
        const unsigned int mb = __ballot_sync(TK_FULL, member);
        const int rank = r + __popc(mb & lt);
        const bool keep = !member ? in
                          : small  ? ((small_kept >> rank) & 1u) != 0u
                                   : kept_below(rank + 1) > kept_below(rank);
        const unsigned int kb = __ballot_sync(TK_FULL, keep);
        if (keep) emit(pos + __popc(kb & lt), (int)(e & ~TK_MEMBER));
        pos += __popc(kb);
        r += __popc(mb);
    }
}

// As tk_select_within, finding the keys' span first.
template <class Emit>
__device__ void tk_select(TopkShared& s, unsigned int* keys, int n, int k, int required,
                          Emit emit) {
    unsigned int l = 0xffffffffu, h = 0u;
    for (int i = threadIdx.x; i < n; i += TOPK_THREADS) {
        l = min(l, keys[i]);
        h = max(h, keys[i]);
    }
    tk_span(s, l, h);
    tk_select_within(s, keys, n, k, required, s.lo, s.hi, emit);
}

// Top-k of each row of `scores` ([rows][n], one block per row, n keys of dynamic shared
// memory): `out[row][0..k)` the kept indices in ascending order.
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
topk_rows(const float* __restrict__ scores, int n, int k, int required,
          unsigned int* __restrict__ out) {
    extern __shared__ unsigned int tk_keys[];
    __shared__ TopkShared s;
    const float* row = scores + (size_t)blockIdx.x * n;
    unsigned int l = 0xffffffffu, h = 0u;
    auto key_of = [&](float x) {
        const unsigned int key = tk_key(x);
        l = min(l, key);
        h = max(h, key);
        return key;
    };
    if ((n & 3) == 0) {
        // 16-byte loads, TK_LOADS per thread in flight: one round trip per 64 KiB of the row.
        const float4* row4 = reinterpret_cast<const float4*>(row);
        uint4* keys4 = reinterpret_cast<uint4*>(tk_keys);
        const int n4 = n >> 2;
        for (int base = threadIdx.x; base < n4; base += TK_LOADS * TOPK_THREADS) {
            float4 v[TK_LOADS];
#pragma unroll
            for (int u = 0; u < TK_LOADS; u++) {
                const int j = base + u * TOPK_THREADS;
                if (j < n4) v[u] = __ldg(row4 + j);
            }
#pragma unroll
            for (int u = 0; u < TK_LOADS; u++) {
                const int j = base + u * TOPK_THREADS;
                if (j < n4)
                    keys4[j] = make_uint4(key_of(v[u].x), key_of(v[u].y), key_of(v[u].z),
                                          key_of(v[u].w));
            }
        }
    } else {
        for (int i = threadIdx.x; i < n; i += TOPK_THREADS) tk_keys[i] = key_of(row[i]);
    }
    tk_span(s, l, h);
    unsigned int* dst = out + (size_t)blockIdx.x * k;
    tk_select_within(s, tk_keys, n, k, required, s.lo, s.hi,
                     [&](int pos, int i) { dst[pos] = (unsigned int)i; });
}
