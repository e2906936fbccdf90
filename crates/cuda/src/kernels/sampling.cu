// Choosing each sequence's next token where its logits are: the argmax, or a draw from the
// softmax at a temperature over the tokens that top-k, top-p and min-p keep. A row is split over
// the blocks of a cluster (grid x; grid y is the row or draw), each block reading one slice of
// ids and the blocks meeting in each other's shared memory; on devices without clusters, one
// block takes the whole row (cluster.cu is compiled in front). Blocks of SAMPLE_THREADS
// threads; SAMPLE_BINS buckets a search.

#define SAMPLE_NEG_INF (__int_as_float(0xff800000))
#define NO_ID 0x7fffffff
// A weight exp((logit - best) / t), at most 1, as a fixed-point count of 2^-40: sums of a whole
// vocabulary stay exact and come out the same in any order.
#define WEIGHT_ONE 1099511627776.0f

// The ids [begin, end) of a row that this block reads: the cluster's ranks take equal slices,
// multiples of 4 long.
struct Slice {
    int begin, end;
};

__device__ __forceinline__ Slice my_slice(int vocab) {
    const int ranks = cluster_ranks(), per = (vocab + 4 * ranks - 1) / (4 * ranks) * 4;
    const int begin = min(vocab, (int)cluster_rank() * per);
    return Slice{begin, min(vocab, begin + per)};
}

// Calls f(i, row[i]) for the ids of `s` this thread takes. Rows of a multiple of 4 logits (so
// 16-byte aligned, and so are the slices) are read 16 bytes at a time with four loads in flight
// a thread. A thread visits its ids out of order.
template <typename F>
__device__ __forceinline__ void each_logit(const float* __restrict__ row, int vocab, Slice s,
                                           F f) {
    if ((vocab & 3) == 0) {
        const float4* quads = reinterpret_cast<const float4*>(row);
        const int end = s.end >> 2, step = blockDim.x;
        int q = (s.begin >> 2) + threadIdx.x;
        for (; q + 3 * step < end; q += 4 * step) {
            float4 v[4];
#pragma unroll
            for (int u = 0; u < 4; u++) v[u] = quads[q + u * step];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int i = 4 * (q + u * step);
                f(i, v[u].x), f(i + 1, v[u].y), f(i + 2, v[u].z), f(i + 3, v[u].w);
            }
        }
        for (; q < end; q += step) {
            const float4 v = quads[q];
            f(4 * q, v.x), f(4 * q + 1, v.y), f(4 * q + 2, v.z), f(4 * q + 3, v.w);
        }
    } else {
        for (int i = s.begin + threadIdx.x; i < s.end; i += blockDim.x) f(i, row[i]);
    }
}

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

// The cluster's largest (v, i) over every thread's (the lowest i among equals; 0 when every v
// is -inf or NaN), written to `out` by rank 0.
__device__ void cluster_best(float bv, int bi, unsigned int* out) {
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    __shared__ float block_v;
    __shared__ unsigned int block_i;
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) best_v[warp] = bv, best_i[warp] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            if (better(best_v[w], best_i[w], bv, bi)) bv = best_v[w], bi = best_i[w];
        block_v = bv, block_i = (unsigned int)bi;
    }
    cluster_sync();
    if (cluster_rank() == 0 && threadIdx.x == 0) {
        for (unsigned int r = 1; r < cluster_ranks(); r++) {
            const float v = load_f32(&block_v, r);
            const int i = (int)load_u32(&block_i, r);
            if (better(v, i, bv, bi)) bv = v, bi = i;
        }
        *out = bi == NO_ID ? 0u : (unsigned int)bi;
    }
    // No block leaves while another may still read its shared memory.
    cluster_sync();
}

// The index of each row's largest logit (the lowest index on ties); a row a cluster.
extern "C" __global__ void argmax_rows(const float* __restrict__ logits, int vocab,
                                       unsigned int* __restrict__ out) {
    const float* row = logits + (unsigned long long)blockIdx.y * vocab;
    float bv = SAMPLE_NEG_INF;
    int bi = NO_ID;
    each_logit(row, vocab, my_slice(vocab), [&](int i, float v) {
        if (better(v, i, bv, bi)) bv = v, bi = i;
    });
    cluster_best(bv, bi, out + blockIdx.y);
}

// A draw from softmax(logits / t) by the Gumbel-max trick: the largest of logit / t + g, with g
// = -log(e), e = -log(1 - v) exponential and v uniform in (0, 1) from a hash of the row's seed
// and the token id. v keeps 53 bits, so its smallest values, which give g's upper tail (up to
// 37 nats), are as fine as its largest; log1pf keeps them exact in single precision.
__device__ __forceinline__ float gumbel(unsigned long long seed, int i) {
    unsigned long long z = seed ^ ((unsigned long long)i * 0xD1B54A32D192ED03ull);
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    // Below 1 after rounding too, so that every kept token's noise is finite.
    const float v = fminf((float)(((double)(z >> 11) + 0.5) * (1.0 / 9007199254740992.0)),
                          0x1.fffffep-1f);
    return -logf(-log1pf(-v));
}

// A finite float as an unsigned key in the same order (-0 as +0, as the host ranks them).
__device__ __forceinline__ unsigned int order_key(float f) {
    const unsigned int b = __float_as_uint(f + 0.0f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float key_value(unsigned int k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// A prefix of a row's ranking (best logit first, the lower id first among equals): the finite
// logits whose key is above `key`, and those whose key equals it with an id up to `last_id`.
struct Prefix {
    unsigned int key;
    int last_id;
};

__device__ __forceinline__ bool in_prefix(unsigned int k, int id, Prefix p) {
    return k > p.key || (k == p.key && id <= p.last_id);
}

__device__ __forceinline__ unsigned long long fixed_weight(float l, float best, float inv_t) {
    return (unsigned long long)(expf((l - best) * inv_t) * WEIGHT_ONE);
}

// The largest and the smallest finite logit of a row (-inf and +inf when there is none), in
// every thread of the cluster.
__device__ void row_span(const float* row, int vocab, float* best, float* low) {
    __shared__ float part_hi[32], part_lo[32], block_hi, block_lo;
    float hi = SAMPLE_NEG_INF, lo = -SAMPLE_NEG_INF;
    each_logit(row, vocab, my_slice(vocab), [&](int, float l) {
        if (isfinite(l)) hi = fmaxf(hi, l), lo = fminf(lo, l);
    });
    for (int o = 16; o > 0; o >>= 1) {
        hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
        lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
    }
    if ((threadIdx.x & 31) == 0) part_hi[threadIdx.x >> 5] = hi, part_lo[threadIdx.x >> 5] = lo;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            hi = fmaxf(hi, part_hi[w]), lo = fminf(lo, part_lo[w]);
        block_hi = hi, block_lo = lo;
    }
    cluster_sync();
    hi = SAMPLE_NEG_INF, lo = -SAMPLE_NEG_INF;
    for (unsigned int r = 0; r < cluster_ranks(); r++)
        hi = fmaxf(hi, load_f32(&block_hi, r)), lo = fminf(lo, load_f32(&block_lo, r));
    *best = hi;
    *low = lo;
}

// The id of the m-th (from 1) token of `within` whose key is `key`, in id order, in every
// thread of the cluster.
__device__ int nth_tie(const float* row, int vocab, unsigned int key, Prefix within,
                       unsigned int m) {
    __shared__ unsigned int ties, warp_ties[32];
    __shared__ int found;
    const Slice s = my_slice(vocab);
    const auto tie = [&](int i, float l) {
        return isfinite(l) && order_key(l) == key && in_prefix(key, i, within);
    };
    cluster_sync();
    if (threadIdx.x == 0) ties = 0, found = NO_ID;
    __syncthreads();
    each_logit(row, vocab, s, [&](int i, float l) {
        if (tie(i, l)) atomicAdd(&ties, 1u);
    });
    cluster_sync();
    // The rank whose slice holds it, and how many come before that slice.
    unsigned int owner = 0, before = 0;
    for (unsigned int r = 0; r < cluster_ranks(); r++) {
        const unsigned int n = load_u32(&ties, r);
        if (before + n >= m) {
            owner = r;
            break;
        }
        before += n;
    }
    if (cluster_rank() == owner) {
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
        for (int start = s.begin; start < s.end && before < m; start += blockDim.x) {
            const int i = start + threadIdx.x;
            const bool t = i < s.end && tie(i, row[i]);
            const unsigned int ballot = __ballot_sync(0xffffffffu, t);
            if (lane == 0) warp_ties[warp] = __popc(ballot);
            __syncthreads();
            unsigned int mine = before, all = 0;
            for (int w = 0; w < warps; w++) {
                mine += w < warp ? warp_ties[w] : 0;
                all += warp_ties[w];
            }
            if (t && mine + __popc(ballot & ((1u << lane) - 1u)) + 1 == m) found = i;
            before += all;
            __syncthreads();
        }
    }
    cluster_sync();
    return (int)load_u32((const unsigned int*)&found, owner);
}

// The shortest prefix of the ranking within `within` whose total reaches `goal`, in every thread
// of the cluster: the total of 1 a token (`weighted` false), or of the tokens' fixed-point
// weights (`weighted` true, the goal then `share` of the total within). All of `within` when its
// total falls short. The tokens are bucketed by value between `best` and `low`, then the bucket
// where the total crosses the goal by key over its own keys, until one value is left; its ties
// go by id. Each block buckets its slice; each adds up the cluster's buckets and finds the same
// crossing.
__device__ Prefix shortest_prefix(const float* row, int vocab, Prefix within, float best,
                                  float low, float inv_t, bool weighted, double share,
                                  unsigned long long goal) {
    // This block's buckets, and the cluster's.
    __shared__ unsigned int count[SAMPLE_BINS], key_lo[SAMPLE_BINS], key_hi[SAMPLE_BINS];
    __shared__ unsigned long long total[SAMPLE_BINS];
    __shared__ unsigned int all_count[SAMPLE_BINS], all_lo[SAMPLE_BINS], all_hi[SAMPLE_BINS];
    __shared__ unsigned long long all_total[SAMPLE_BINS];
    // The span still searched, the total of `within` above it and whether it is one value
    // (1), the total fell short (2) or the search goes on (0).
    __shared__ unsigned int span_hi, span_lo, ties, state;
    __shared__ unsigned long long above, goal_s, tie_total;
    const Slice s = my_slice(vocab);
    __syncthreads();
    if (threadIdx.x == 0) {
        span_hi = order_key(best), span_lo = order_key(low), above = 0, goal_s = goal;
        state = 0, ties = 0, tie_total = 0;
    }
    __syncthreads();
    for (bool first = true; state == 0; first = false) {
        for (int b = threadIdx.x; b < SAMPLE_BINS; b += blockDim.x)
            count[b] = 0, total[b] = 0, key_lo[b] = 0xffffffffu, key_hi[b] = 0;
        __syncthreads();
        const unsigned int k_hi = span_hi, k_lo = span_lo;
        // By value over the whole span first (keys crowd near zero), by key after (each pass
        // then narrows the keys by SAMPLE_BINS, so few passes end it).
        const double hi = key_value(k_hi), lo = key_value(k_lo);
        const double scale = !first ? (double)SAMPLE_BINS / ((double)(k_hi - k_lo) + 1.0)
                                    : hi > lo ? SAMPLE_BINS / (hi - lo) : 0.0;
        each_logit(row, vocab, s, [&](int i, float l) {
            if (!isfinite(l)) return;
            const unsigned int k = order_key(l);
            if (k < k_lo || k > k_hi || !in_prefix(k, i, within)) return;
            const double off = first ? hi - (double)l : (double)(k_hi - k);
            const int b = min(SAMPLE_BINS - 1, (int)(off * scale));
            atomicAdd(&count[b], 1u);
            if (weighted) atomicAdd(&total[b], fixed_weight(l, best, inv_t));
            atomicMin(&key_lo[b], k);
            atomicMax(&key_hi[b], k);
        });
        cluster_sync();
        for (int b = threadIdx.x; b < SAMPLE_BINS; b += blockDim.x) {
            unsigned int n = 0, klo = 0xffffffffu, khi = 0;
            unsigned long long t = 0;
            for (unsigned int r = 0; r < cluster_ranks(); r++) {
                n += load_u32(&count[b], r);
                t += load_u64(&total[b], r);
                klo = min(klo, load_u32(&key_lo[b], r));
                khi = max(khi, load_u32(&key_hi[b], r));
            }
            all_count[b] = n, all_total[b] = t, all_lo[b] = klo, all_hi[b] = khi;
        }
        // Every block has read the others' buckets before any clears its own.
        cluster_sync();
        if (threadIdx.x < 32) {
            // Lane j scans buckets 32j to 32j + 31, best first.
            const int lane = threadIdx.x, per = SAMPLE_BINS / 32;
            unsigned long long sum = 0;
            for (int b = lane * per; b < (lane + 1) * per; b++)
                sum += weighted ? all_total[b] : all_count[b];
            unsigned long long before = sum;
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned long long x = __shfl_up_sync(0xffffffffu, before, o);
                if (lane >= o) before += x;
            }
            const unsigned long long all = __shfl_sync(0xffffffffu, before, 31);
            before += above - sum;
            const unsigned long long g =
                first && weighted ? (unsigned long long)((double)all * share) : goal_s;
            int hit = -1;
            for (int b = lane * per; b < (lane + 1) * per && hit < 0; b++) {
                const unsigned long long v = weighted ? all_total[b] : all_count[b];
                if (all_count[b] > 0 && before + v >= g) hit = b;
                else before += v;
            }
            const unsigned int hits = __ballot_sync(0xffffffffu, hit >= 0);
            if (hits == 0) {
                if (lane == 0) state = 2;
            } else if (lane == __ffs(hits) - 1) {
                above = before, goal_s = g;
                span_hi = all_hi[hit], span_lo = all_lo[hit];
                ties = all_count[hit], tie_total = weighted ? all_total[hit] : all_count[hit];
                state = span_hi == span_lo ? 1 : 0;
            }
        }
        __syncthreads();
    }
    if (state == 2) return within;
    const unsigned int key = span_hi;
    unsigned int m = 1;
    if (goal_s > above) {
        // Every tie weighs the same: how many of them the total needs.
        const unsigned long long each = tie_total / ties, need = goal_s - above;
        m = each == 0 ? ties : (unsigned int)min((need + each - 1) / each, (unsigned long long)ties);
    }
    if (m >= ties) return Prefix{key, key == within.key ? within.last_id : NO_ID};
    return Prefix{key, nth_tie(row, vocab, key, within, m)};
}

// One draw (sampling.rs's DrawArgs): inv_t 0 picks the argmax; top_k 0 keeps every token.
struct __align__(16) DrawArgs {
    int row;
    float inv_t;
    unsigned int top_k;
    float top_p, min_p;
    unsigned int pad;
    unsigned long long seed;
};

// out[j] = the token of row draws[j].row (a draw a cluster): the argmax of its logits when
// inv_t is 0, else a draw from softmax(logits * inv_t) seeded by seed over the tokens the cuts
// keep: the top_k best (0: all), of those the shortest prefix of the ranking whose probability
// reaches top_p (the token that crosses it kept), and those at least min_p times as likely as
// the best. Ties go to the lower id; a logit that is not finite is never drawn, as on the host.
extern "C" __global__ void draw_rows(const float* __restrict__ logits, int vocab,
                                     const DrawArgs* __restrict__ draws,
                                     unsigned int* __restrict__ out) {
    const int j = blockIdx.y;
    const DrawArgs d = draws[j];
    const float* row = logits + (unsigned long long)d.row * vocab;
    float it = d.inv_t;
    const unsigned int k = d.top_k;
    const float p = d.top_p, mp = d.min_p;
    const unsigned long long seed = d.seed;
    const bool cut_k = k > 0 && k < (unsigned int)vocab;
    bool cut = it != 0.0f && (cut_k || p < 1.0f || mp > 0.0f);
    Prefix kept{0u, NO_ID};
    float best = 0.0f;
    if (cut) {
        float low;
        row_span(row, vocab, &best, &low);
        if (best == SAMPLE_NEG_INF) {
            // No finite logit: the argmax, as the host gives.
            it = 0.0f, cut = false;
        } else {
            if (cut_k) kept = shortest_prefix(row, vocab, kept, best, low, it, false, 0.0, k);
            if (p < 1.0f) kept = shortest_prefix(row, vocab, kept, best, low, it, true, p, 0);
        }
    }
    float bv = SAMPLE_NEG_INF;
    int bi = NO_ID;
    each_logit(row, vocab, my_slice(vocab), [&](int i, float l) {
        float v;
        if (it == 0.0f) v = l;
        else if (!isfinite(l)) v = SAMPLE_NEG_INF;
        else if (cut && (!in_prefix(order_key(l), i, kept) ||
                         (mp > 0.0f && expf((l - best) * it) < mp)))
            v = SAMPLE_NEG_INF;
        else v = l * it + gumbel(seed, i);
        if (better(v, i, bv, bi)) bv = v, bi = i;
    });
    cluster_best(bv, bi, out + j);
}

// Each masked row's logits outside its mask become -inf: row rows[m] under mask m, `words`
// 64-bit words a mask, token i at bit i % 64 of word i / 64. A block a (slice, mask).
extern "C" __global__ void mask_rows(float* __restrict__ logits, int vocab,
                                     const int* __restrict__ rows,
                                     const unsigned long long* __restrict__ masks, int words) {
    float* row = logits + (unsigned long long)rows[blockIdx.y] * vocab;
    const unsigned long long* mask = masks + (unsigned long long)blockIdx.y * words;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < vocab; i += gridDim.x * blockDim.x) {
        if (!((mask[i >> 6] >> (i & 63)) & 1ull)) row[i] = SAMPLE_NEG_INF;
    }
}
