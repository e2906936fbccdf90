// Log-probabilities where the logits are, for requests that ask for them: a row's
// log-sum-exp and its best tokens from the raw logits (before a grammar's mask), and, once the
// token is drawn, the drawn token's. A block a row; blocks of LP_THREADS threads.

#define LP_THREADS 512
#define LP_NEG_INF (__int_as_float(0xff800000))
#define LP_NO_ID 0x7fffffff

// (v, i) ranks before (bv, bi): the larger value, the lower id among equals.
__device__ __forceinline__ bool lp_before(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

// The block's first (v, i) in that order, in every thread.
__device__ void lp_block_best(float& bv, int& bi) {
    __shared__ float sv[LP_THREADS / 32];
    __shared__ int si[LP_THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (lp_before(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) sv[warp] = bv, si[warp] = bi;
    __syncthreads();
    bv = sv[0], bi = si[0];
    for (int w = 1; w < LP_THREADS / 32; w++)
        if (lp_before(sv[w], si[w], bv, bi)) bv = sv[w], bi = si[w];
    __syncthreads();
}

// (m, s) with s = sum of exp(x - m) over a part of a row, merged with another part's.
__device__ __forceinline__ void lp_merge(float& m, float& s, float om, float os) {
    const float big = fmaxf(m, om);
    if (big == LP_NEG_INF) return;
    s = s * expf(m - big) + os * expf(om - big);
    m = big;
}

// Row rows[j] of `logits`: lse[j] its log-sum-exp (over finite logits) and its `top` first
// tokens by value (lower ids first among equals), top_ids[j][t] and top_lp[j][t] = logit - lse.
extern "C" __global__ void __launch_bounds__(LP_THREADS)
logprob_rows(const float* __restrict__ logits, int vocab, const int* __restrict__ rows, int top,
             float* __restrict__ lse, unsigned int* __restrict__ top_ids,
             float* __restrict__ top_lp) {
    const int j = blockIdx.x;
    const float* row = logits + (unsigned long long)rows[j] * vocab;
    float m = LP_NEG_INF, s = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += LP_THREADS) {
        const float x = row[i];
        if (!(x > LP_NEG_INF) || !(x < __int_as_float(0x7f800000))) continue;
        if (x > m) {
            s = s * expf(m - x) + 1.0f;
            m = x;
        } else {
            s += expf(x - m);
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float om = __shfl_xor_sync(0xffffffffu, m, o);
        const float os = __shfl_xor_sync(0xffffffffu, s, o);
        lp_merge(m, s, om, os);
    }
    __shared__ float wm[LP_THREADS / 32], ws[LP_THREADS / 32];
    __shared__ float row_lse;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) wm[warp] = m, ws[warp] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < LP_THREADS / 32; w++) lp_merge(m, s, wm[w], ws[w]);
        row_lse = m + logf(s);
        lse[j] = row_lse;
    }
    __syncthreads();
    const float l = row_lse;
    // Each pass takes the first token after the last one taken.
    float pv = __int_as_float(0x7f800000);
    int pi = -1;
    for (int t = 0; t < top; t++) {
        float bv = LP_NEG_INF;
        int bi = LP_NO_ID;
        for (int i = threadIdx.x; i < vocab; i += LP_THREADS) {
            const float x = row[i];
            const bool after = x < pv || (x == pv && i > pi);
            if (after && lp_before(x, i, bv, bi)) bv = x, bi = i;
        }
        lp_block_best(bv, bi);
        if (threadIdx.x == 0) {
            top_ids[j * top + t] = bi == LP_NO_ID ? 0u : (unsigned int)bi;
            top_lp[j * top + t] = bv - l;
        }
        pv = bv, pi = bi;
    }
}

// The drawn token's log-probability: logit - lse of row rows[j], token picks[pick_of[j]] (read
// after a mask, which keeps the logits of the tokens it allows).
extern "C" __global__ void chosen_logprobs(const float* __restrict__ logits, int vocab,
                                           const int* __restrict__ rows,
                                           const unsigned int* __restrict__ picks,
                                           const int* __restrict__ pick_of,
                                           const float* __restrict__ lse, int n,
                                           float* __restrict__ out) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    const unsigned int token = picks[pick_of[j]];
    out[j] = token < (unsigned int)vocab
                 ? logits[(unsigned long long)rows[j] * vocab + token] - lse[j]
                 : LP_NEG_INF;
}
