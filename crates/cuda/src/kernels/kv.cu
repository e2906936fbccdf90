// KV pool kernels. Defines: HEAD_DIM, PAGE_SIZE.
// Pool layout (as on the CPU): [page][kv_head][slot][dim], bf16 stored as raw 16-bit values.

__device__ __forceinline__ unsigned short f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    return (unsigned short)(u >> 16);
}

// Writes `tokens` tokens of K and V (f32, [tokens][kv_heads][HEAD_DIM]) into the slots
// `slots[2 t]` (page) and `slots[2 t + 1]` (slot within the page).
extern "C" __global__ void kv_append(unsigned short* __restrict__ kpool,
                                     unsigned short* __restrict__ vpool,
                                     const float* __restrict__ k, const float* __restrict__ v,
                                     const unsigned int* __restrict__ slots, int tokens,
                                     int kv_heads) {
    const unsigned long long n = (unsigned long long)tokens * kv_heads * HEAD_DIM;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const int d = (int)(i % HEAD_DIM);
        const unsigned long long th = i / HEAD_DIM;
        const int h = (int)(th % kv_heads);
        const int t = (int)(th / kv_heads);
        const unsigned int page = slots[2 * t], slot = slots[2 * t + 1];
        const unsigned long long dst =
            (((unsigned long long)page * kv_heads + h) * PAGE_SIZE + slot) * HEAD_DIM + d;
        kpool[dst] = f32_to_bf16(k[i]);
        vpool[dst] = f32_to_bf16(v[i]);
    }
}

// Fills `n` bf16 values with uniform numbers in [-1, 1) from a hash of (seed, index).
extern "C" __global__ void fill_uniform_bf16(unsigned short* __restrict__ x, unsigned long long n,
                                             unsigned long long seed) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned long long z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        const float u = (float)(z >> 40) * (1.0f / 16777216.0f);
        x[i] = f32_to_bf16(2.0f * u - 1.0f);
    }
}

// Cache phase of block top-k: the mean key of each listed page, per KV head, written as bf16
// into `out`, laid out as the CPU's page fields ([kv_head][pool page][HEAD_DIM]).
// grid: (pages listed, kv_heads); block: HEAD_DIM threads, one dim each.
extern "C" __global__ void page_means(const unsigned short* __restrict__ kpool,
                                      const unsigned int* __restrict__ pages, int kv_heads,
                                      int num_pages, unsigned short* __restrict__ out) {
    const unsigned int page = pages[blockIdx.x];
    const int h = blockIdx.y, d = threadIdx.x;
    const unsigned short* k =
        kpool + ((unsigned long long)page * kv_heads + h) * PAGE_SIZE * HEAD_DIM + d;
    float sum = 0.f;
    for (int t = 0; t < PAGE_SIZE; t++) sum += __uint_as_float((unsigned int)k[t * HEAD_DIM] << 16);
    out[((unsigned long long)h * num_pages + page) * HEAD_DIM + d] = f32_to_bf16(sum / PAGE_SIZE);
}

// Cache phase of Quest: the elementwise max and min key of each listed page, per KV head, as
// bf16 into `kmax` and `kmin` ([kv_head][pool page][HEAD_DIM]). Grid and block as page_means.
extern "C" __global__ void page_minmax(const unsigned short* __restrict__ kpool,
                                       const unsigned int* __restrict__ pages, int kv_heads,
                                       int num_pages, unsigned short* __restrict__ kmax,
                                       unsigned short* __restrict__ kmin) {
    const unsigned int page = pages[blockIdx.x];
    const int h = blockIdx.y, d = threadIdx.x;
    const unsigned short* k =
        kpool + ((unsigned long long)page * kv_heads + h) * PAGE_SIZE * HEAD_DIM + d;
    float hi = __uint_as_float((unsigned int)k[0] << 16), lo = hi;
    for (int t = 1; t < PAGE_SIZE; t++) {
        const float x = __uint_as_float((unsigned int)k[t * HEAD_DIM] << 16);
        hi = fmaxf(hi, x);
        lo = fminf(lo, x);
    }
    const unsigned long long o = ((unsigned long long)h * num_pages + page) * HEAD_DIM + d;
    kmax[o] = f32_to_bf16(hi);
    kmin[o] = f32_to_bf16(lo);
}
