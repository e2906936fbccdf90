// KV pool kernels. Defines: HEAD_DIM, PAGE_SIZE, KV_FP8 (kv_elem.cu is compiled in front).
// Pool layout (as on the CPU): [page][kv_head][slot][dim], elements kv_t.

// Writes `tokens` tokens of K and V (f32, [tokens][kv_heads][HEAD_DIM]) into the slots
// `slots[2 t]` (page) and `slots[2 t + 1]` (slot within the page).
extern "C" __global__ void kv_append(kv_t* __restrict__ kpool, kv_t* __restrict__ vpool,
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
        kpool[dst] = kv_put(k[i]);
        vpool[dst] = kv_put(v[i]);
    }
}

__device__ __forceinline__ float uniform_at(unsigned long long seed, unsigned long long i) {
    unsigned long long z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return 2.0f * ((float)(z >> 40) * (1.0f / 16777216.0f)) - 1.0f;
}

// Fills `n` bf16 values with uniform numbers in [-1, 1) from a hash of (seed, index).
extern "C" __global__ void fill_uniform_bf16(unsigned short* __restrict__ x, unsigned long long n,
                                             unsigned long long seed) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        x[i] = kv_f32_to_bf16(uniform_at(seed, i));
}

// The same numbers, rounded to the pool's element type.
extern "C" __global__ void fill_uniform_kv(kv_t* __restrict__ x, unsigned long long n,
                                           unsigned long long seed) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        x[i] = kv_put(uniform_at(seed, i));
}

// The mean over a page's tokens of key dim threadIdx.x, for page pages[blockIdx.x] and KV head
// blockIdx.y; `at` is its place in a page field ([kv_head][pool page][HEAD_DIM]).
__device__ __forceinline__ float page_mean(const kv_t* __restrict__ kpool,
                                           const unsigned int* __restrict__ pages, int kv_heads,
                                           int num_pages, unsigned long long& at) {
    const unsigned int page = pages[blockIdx.x];
    const int h = blockIdx.y, d = threadIdx.x;
    const kv_t* k = kpool + ((unsigned long long)page * kv_heads + h) * PAGE_SIZE * HEAD_DIM + d;
    float sum = 0.f;
    for (int t = 0; t < PAGE_SIZE; t++) sum += kv_get(k[t * HEAD_DIM]);
    at = ((unsigned long long)h * num_pages + page) * HEAD_DIM + d;
    return sum / PAGE_SIZE;
}

// Cache phase of block top-k: the mean key of each listed page, per KV head, written as bf16
// into `out`, laid out as the CPU's page fields ([kv_head][pool page][HEAD_DIM]).
// grid: (pages listed, kv_heads); block: HEAD_DIM threads, one dim each.
extern "C" __global__ void page_means(const kv_t* __restrict__ kpool,
                                      const unsigned int* __restrict__ pages, int kv_heads,
                                      int num_pages, unsigned short* __restrict__ out) {
    unsigned long long at;
    const float mean = page_mean(kpool, pages, kv_heads, num_pages, at);
    out[at] = kv_f32_to_bf16(mean);
}

// The same means as fp8 e4m3 (block_topk_fp8's centroids), one byte each.
extern "C" __global__ void page_means_fp8(const kv_t* __restrict__ kpool,
                                          const unsigned int* __restrict__ pages, int kv_heads,
                                          int num_pages, unsigned char* __restrict__ out) {
    unsigned long long at;
    const float mean = page_mean(kpool, pages, kv_heads, num_pages, at);
    out[at] = kv_f32_to_fp8(mean);
}

// The elementwise max (`hi`) and min (`lo`) over a page's tokens of key dim threadIdx.x, for
// page pages[blockIdx.x] and KV head blockIdx.y; `at` is their place in a page field.
__device__ __forceinline__ void page_envelope(const kv_t* __restrict__ kpool,
                                              const unsigned int* __restrict__ pages,
                                              int kv_heads, int num_pages, float& hi, float& lo,
                                              unsigned long long& at) {
    const unsigned int page = pages[blockIdx.x];
    const int h = blockIdx.y, d = threadIdx.x;
    const kv_t* k = kpool + ((unsigned long long)page * kv_heads + h) * PAGE_SIZE * HEAD_DIM + d;
    hi = kv_get(k[0]);
    lo = hi;
    for (int t = 1; t < PAGE_SIZE; t++) {
        const float x = kv_get(k[t * HEAD_DIM]);
        hi = fmaxf(hi, x);
        lo = fminf(lo, x);
    }
    at = ((unsigned long long)h * num_pages + page) * HEAD_DIM + d;
}

// Cache phase of Quest: the elementwise max and min key of each listed page, per KV head, as
// bf16 into `kmax` and `kmin` ([kv_head][pool page][HEAD_DIM]). Grid and block as page_means.
extern "C" __global__ void page_minmax(const kv_t* __restrict__ kpool,
                                       const unsigned int* __restrict__ pages, int kv_heads,
                                       int num_pages, unsigned short* __restrict__ kmax,
                                       unsigned short* __restrict__ kmin) {
    float hi, lo;
    unsigned long long at;
    page_envelope(kpool, pages, kv_heads, num_pages, hi, lo, at);
    kmax[at] = kv_f32_to_bf16(hi);
    kmin[at] = kv_f32_to_bf16(lo);
}

// The same envelopes as fp8 e4m3 (quest_fp8's), one byte each.
extern "C" __global__ void page_minmax_fp8(const kv_t* __restrict__ kpool,
                                           const unsigned int* __restrict__ pages, int kv_heads,
                                           int num_pages, unsigned char* __restrict__ kmax,
                                           unsigned char* __restrict__ kmin) {
    float hi, lo;
    unsigned long long at;
    page_envelope(kpool, pages, kv_heads, num_pages, hi, lo, at);
    kmax[at] = kv_f32_to_fp8(hi);
    kmin[at] = kv_f32_to_fp8(lo);
}
