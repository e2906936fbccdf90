// Causal prefill attention over the paged KV cache, flash-style: a block takes a tile of up to
// TQ consecutive query tokens of one sequence and one KV head (its GROUP query heads), streams
// the sequence's keys and values through shared memory KT at a time, and keeps an online
// softmax per query row. Defines: HEAD_DIM, GROUP, PAGE_SIZE, KV_FP8 (kv_elem.cu is compiled in
// front; keys and values are staged in shared memory as bf16 either way).
//
// Warp w owns token w of the tile; lane j scores key j of each key tile against the token's
// GROUP heads, then the lanes split the head's dimensions for the weighted sum of values.

#define NEG_INF __int_as_float(0xff800000)

#define TQ 8
#define KT 32
// Keys are stored with one spare 32-bit word per row, so the lanes' rows fall in distinct banks.
#define KSTRIDE (HEAD_DIM + 2)
#define DPL ((HEAD_DIM + 31) / 32)

__device__ __forceinline__ float bf16_lo(unsigned int w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(unsigned int w) { return __uint_as_float(w & 0xffff0000u); }

// tiles[b] = (first query row, tokens, page-table row, position of the first token). With
// `window` > 0 a token sees only the last `window` positions, its own included. Dynamic shared
// memory: the tile's queries, [TQ][GROUP][HEAD_DIM] floats.
extern "C" __global__ void __launch_bounds__(TQ * 32)
    prefill_attention(const kv_t* __restrict__ kpool, const kv_t* __restrict__ vpool,
                      const unsigned int* __restrict__ indptr,
                      const unsigned int* __restrict__ indices, const float* __restrict__ q,
                      const int4* __restrict__ tiles, int hq, int hkv, float scale_log2,
                      int window, float* __restrict__ out) {
    extern __shared__ float qs[];
    __shared__ __align__(16) unsigned short ks[KT][KSTRIDE];
    __shared__ __align__(16) unsigned short vs[KT][HEAD_DIM];
    const int4 tile = tiles[blockIdx.x];
    const int kh = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int e = threadIdx.x; e < TQ * GROUP * HEAD_DIM; e += blockDim.x) {
        const int t = e / (GROUP * HEAD_DIM), r = e % (GROUP * HEAD_DIM);
        const int g = r / HEAD_DIM, d = r % HEAD_DIM;
        qs[(t * GROUP + g) * HEAD_DIM + d] = t < tile.y
                          ? q[((unsigned long long)(tile.x + t) * hq + kh * GROUP + g) * HEAD_DIM + d]
                          : 0.0f;
    }
    const unsigned int* pages = indices + indptr[tile.z];
    const bool active = warp < tile.y;
    const float* qw = qs + warp * GROUP * HEAD_DIM;
    const int my_pos = tile.w + warp, last_pos = tile.w + tile.y - 1;
    float m[GROUP], l[GROUP], acc[GROUP][DPL];
#pragma unroll
    for (int g = 0; g < GROUP; g++) {
        m[g] = NEG_INF;
        l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[g][i] = 0.0f;
    }
    // The first key this token sees; tiles before the tile's first token's window are skipped.
    const int my_first = window > 0 ? max(0, my_pos - window + 1) : 0;
    const int tile_first = window > 0 ? max(0, tile.w - window + 1) : 0;
    for (int k0 = tile_first / KT * KT; k0 <= last_pos; k0 += KT) {
        __syncthreads();
        for (int e = threadIdx.x; e < KT * (HEAD_DIM / 2); e += blockDim.x) {
            const int j = e / (HEAD_DIM / 2), w = e % (HEAD_DIM / 2), p = k0 + j;
            unsigned int kk = 0, vv = 0;
            if (p <= last_pos) {
                const unsigned long long base =
                    (((unsigned long long)pages[p / PAGE_SIZE] * hkv + kh) * PAGE_SIZE +
                     p % PAGE_SIZE) * HEAD_DIM;
                kk = kv_pair(kpool + base, w);
                vv = kv_pair(vpool + base, w);
            }
            reinterpret_cast<unsigned int*>(&ks[j][0])[w] = kk;
            reinterpret_cast<unsigned int*>(&vs[j][0])[w] = vv;
        }
        __syncthreads();
        if (!active) continue;
        float s[GROUP];
#pragma unroll
        for (int g = 0; g < GROUP; g++) s[g] = 0.0f;
        const unsigned int* krow = reinterpret_cast<const unsigned int*>(&ks[lane][0]);
#pragma unroll 8
        for (int w = 0; w < HEAD_DIM / 2; w++) {
            const unsigned int kk = krow[w];
            const float a = bf16_lo(kk), b = bf16_hi(kk);
#pragma unroll
            for (int g = 0; g < GROUP; g++)
                s[g] += qw[g * HEAD_DIM + 2 * w] * a + qw[g * HEAD_DIM + 2 * w + 1] * b;
        }
        const bool valid = k0 + lane <= my_pos && k0 + lane >= my_first;
#pragma unroll
        for (int g = 0; g < GROUP; g++) {
            const float sc = valid ? s[g] * scale_log2 : NEG_INF;
            float mx = sc;
            for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            // A token whose window starts past this tile has no key yet: weights of zero.
            const float m_new = fmaxf(m[g], mx);
            const float base = m_new == NEG_INF ? 0.0f : m_new;
            const float p = exp2f(sc - base), corr = exp2f(m[g] - base);
            float ps = p;
            for (int o = 16; o > 0; o >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
            l[g] = l[g] * corr + ps;
            m[g] = m_new;
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[g][i] *= corr;
            // Keys outside the token's window add nothing (0 x inf would be NaN).
            for (int j = max(0, my_first - k0); j < KT && k0 + j <= my_pos; j++) {
                const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
                for (int i = 0; i < DPL; i++) {
                    const int d = lane + 32 * i;
                    if (d < HEAD_DIM) acc[g][i] += pj * __uint_as_float(((unsigned int)vs[j][d]) << 16);
                }
            }
        }
    }
    if (!active) return;
#pragma unroll
    for (int g = 0; g < GROUP; g++) {
        const float inv = 1.0f / l[g];
        float* o = out + ((unsigned long long)(tile.x + warp) * hq + kh * GROUP + g) * HEAD_DIM;
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            const int d = lane + 32 * i;
            if (d < HEAD_DIM) o[d] = acc[g][i] * inv;
        }
    }
}
