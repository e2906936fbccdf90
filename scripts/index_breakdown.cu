// Where block_topk's index kernel spends its time at 32K context, batch 16, Qwen3-8B attention
// geometry (128 rows of 2048 candidate pages, shuffled over the pool): the shipped kernel (exact
// and approximate), its centroid scoring alone, and a plain gather of the same centroid bytes by
// the same grid. Back-to-back launches over three copies of the centroids, median of 20 groups
// of 30. On a machine with nvcc, from scripts/:
//   nvcc -O3 -std=c++17 -arch=sm_90 --extended-lambda -DHEAD_DIM=128 -DGROUP=4 -DSUMMARIES=1 \
//     -DTK_UNROLL=1 -o index_breakdown index_breakdown.cu && ./index_breakdown
#include <cstdio>
#include <vector>
#include <random>
#include <algorithm>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "../crates/cuda/src/kernels/topk.cu"
#include "../crates/cuda/src/kernels/mma.cu"
#include "../crates/cuda/src/kernels/scores.cu"
#include "../crates/cuda/src/kernels/index_row.cu"
#include "../crates/cuda/src/kernels/block_topk.cu"
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
score_only(const uint4* __restrict__ f0, int num_pages, const unsigned int* __restrict__ dense_indptr,
           const unsigned int* __restrict__ dense_indices, const float* __restrict__ q,
           const SelRow* __restrict__ rows, int kv_heads, unsigned int* __restrict__ out) {
    extern __shared__ unsigned int tk_keys[];
    const SelRow r = rows[blockIdx.x];
    const unsigned int* logical = dense_indices + dense_indptr[r.seq];
    const int n = r.pages - r.sinks - r.recent;
    const unsigned int* cand = logical + r.sinks;
#if MMA_CENTROIDS
    mma_scores<false>(f0, (size_t)r.head * num_pages * ROW_VEC, cand, n,
                      q + ((size_t)r.seq * kv_heads + r.head) * GROUP * HEAD_DIM,
                      [&](int i, int, float x) { tk_keys[i] = tk_key(x); });
#endif
    __syncthreads();
    if (threadIdx.x == 0) out[blockIdx.x] = tk_keys[5];
}
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
gather_only(const uint4* __restrict__ f0, int num_pages, const unsigned int* __restrict__ dense_indptr,
           const unsigned int* __restrict__ dense_indices, const float* __restrict__ q,
           const SelRow* __restrict__ rows, int kv_heads, unsigned int* __restrict__ out) {
    const SelRow r = rows[blockIdx.x];
    const unsigned int* cand = dense_indices + dense_indptr[r.seq] + r.sinks;
    const int n = r.pages - r.sinks - r.recent;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    size_t head_off = (size_t)r.head * num_pages * ROW_VEC;
    unsigned acc = 0;
    for (int tile = warp; tile < (n + 15) / 16; tile += TK_WARPS) {
        uint4 x[2][4];
        for (int h = 0; h < 2; h++) {
            int i = tile * 16 + g + 8 * h;
            unsigned id = i < n ? cand[i] : 0;
            const uint4* p = f0 + head_off + (size_t)id * ROW_VEC + t;
            for (int c = 0; c < 4; c++) x[h][c] = __ldg(p + 4 * c);
        }
        for (int h = 0; h < 2; h++) for (int c = 0; c < 4; c++) acc ^= x[h][c].x ^ x[h][c].y ^ x[h][c].z ^ x[h][c].w;
    }
    if (acc == 12345) out[blockIdx.x] = acc;
}
int main() {
    const int seqs = 16, heads = 8, pages_per = 2048, num_pages = seqs * pages_per + 64;
    std::mt19937 rng(3);
    std::vector<unsigned> perm(num_pages); for (int i = 0; i < num_pages; i++) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<unsigned> indptr(seqs + 1), indices(seqs * pages_per);
    for (int s = 0; s <= seqs; s++) indptr[s] = s * pages_per;
    for (int i = 0; i < seqs * pages_per; i++) indices[i] = perm[i];
    std::vector<SelRow> rows;
    for (int s = 0; s < seqs; s++) for (int h = 0; h < heads; h++)
        rows.push_back({s, h, pages_per, 1, 1, 126, (int)rows.size() * 128, 0});
    std::normal_distribution<float> nd;
    const int copies = 3;
    size_t fsz = (size_t)heads * num_pages * 128;
    std::vector<__nv_bfloat16> hf(fsz * copies);
    for (auto& x : hf) x = __float2bfloat16(nd(rng));
    std::vector<float> hq(seqs * heads * GROUP * 128); for (auto& x : hq) x = nd(rng);
    __nv_bfloat16* f; unsigned *dip, *dix, *out; float* q; SelRow* dr;
    cudaMalloc(&f, hf.size() * 2); cudaMemcpy(f, hf.data(), hf.size() * 2, cudaMemcpyHostToDevice);
    cudaMalloc(&dip, indptr.size() * 4); cudaMemcpy(dip, indptr.data(), indptr.size() * 4, cudaMemcpyHostToDevice);
    cudaMalloc(&dix, indices.size() * 4); cudaMemcpy(dix, indices.data(), indices.size() * 4, cudaMemcpyHostToDevice);
    cudaMalloc(&q, hq.size() * 4); cudaMemcpy(q, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice);
    cudaMalloc(&dr, rows.size() * sizeof(SelRow)); cudaMemcpy(dr, rows.data(), rows.size() * sizeof(SelRow), cudaMemcpyHostToDevice);
    cudaMalloc(&out, 1 << 20);
    int smem = pages_per * 4;
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    auto fptr = [&](int i) { return (const uint4*)(f + (i % copies) * fsz); };
    for (int rep = 0; rep < 2; rep++)
    for (int mode = 0; mode < 4; mode++) {
        auto launch = [&](int i) {
            if (mode == 0) index_select<<<128, TOPK_THREADS, smem>>>(fptr(i), fptr(i), num_pages, dip, dix, q, dr, heads, 0.f, out, nullptr);
            else if (mode == 1) index_select<<<128, TOPK_THREADS, smem>>>(fptr(i), fptr(i), num_pages, dip, dix, q, dr, heads, 0.03f, out, nullptr);
            else if (mode == 2) score_only<<<128, TOPK_THREADS, smem>>>(fptr(i), num_pages, dip, dix, q, dr, heads, out);
            else gather_only<<<128, TOPK_THREADS>>>(fptr(i), num_pages, dip, dix, q, dr, heads, out);
        };
        for (int i = 0; i < 6; i++) launch(i);
        std::vector<float> ts;
        for (int g = 0; g < 20; g++) {
            cudaEventRecord(a); for (int i = 0; i < 30; i++) launch(i); cudaEventRecord(b); cudaEventSynchronize(b);
            float ms; cudaEventElapsedTime(&ms, a, b); ts.push_back(ms / 30 * 1e3);
        }
        std::sort(ts.begin(), ts.end());
        const char* names[] = {"index exact", "index approx", "scores only", "gather only"};
        printf("%-14s %.1f us (min %.1f)\n", names[mode], ts[ts.size() / 2], ts[0]);
    }
    printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
