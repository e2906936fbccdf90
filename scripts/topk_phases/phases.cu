// Where the stand-alone top-k (topk_rows) spends its time: exact and approximate over 128 rows of
// 32768 scores, each of four distributions, timed with CUDA events (median of 30 groups of 20
// launches), and the cycles from the block's start to the end of each phase (mark.py), averaged
// over the blocks. On a machine with nvcc:
//   python3 mark.py && nvcc -O3 -std=c++17 -arch=sm_90 --extended-lambda -o phases phases.cu && ./phases [n]
// (-DTK_UNROLL=1 builds it as the fused index kernels do.)
#ifndef TK_UNROLL
#define TK_UNROLL 4  // as the stand-alone module builds it
#endif
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <random>
#include <cmath>
#include "topk_marked.cu"

// Load-only: the same load and span, nothing else.
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
load_only(const float* __restrict__ scores, int n, unsigned int* __restrict__ out) {
    extern __shared__ unsigned int tk_keys[];
    __shared__ TopkShared s;
    const float* row = scores + (size_t)blockIdx.x * n;
    unsigned int l = 0xffffffffu, h = 0u;
    const float4* row4 = reinterpret_cast<const float4*>(row);
    uint4* keys4 = reinterpret_cast<uint4*>(tk_keys);
    const int n4 = n >> 2;
    for (int base = threadIdx.x; base < n4; base += 4 * TOPK_THREADS) {
        float4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) { const int j = base + u * TOPK_THREADS; if (j < n4) v[u] = __ldg(row4 + j); }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int j = base + u * TOPK_THREADS;
            if (j < n4) {
                uint4 k4 = make_uint4(tk_key(v[u].x), tk_key(v[u].y), tk_key(v[u].z), tk_key(v[u].w));
                l = min(l, min(min(k4.x, k4.y), min(k4.z, k4.w)));
                h = max(h, max(max(k4.x, k4.y), max(k4.z, k4.w)));
                keys4[j] = k4;
            }
        }
    }
    tk_span(s, l, h);
    if (threadIdx.x == 0) out[blockIdx.x] = s.lo ^ s.hi ^ tk_keys[n - 1];
}

int main(int argc, char** argv) {
    const int rows = 128, n = argc > 1 ? atoi(argv[1]) : 32768, k = n / 16 - 2;
    const char* names[4] = {"normal", "log-normal", "uniform", "bimodal"};
    std::mt19937_64 rng(7);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::uniform_real_distribution<float> ud(0.f, 1.f);
    float* d; unsigned int* out; cudaMalloc(&d, 4 * (size_t)rows * n * 4); cudaMalloc(&out, rows * n * 4);
    cudaFuncSetAttribute(topk_rows, cudaFuncAttributeMaxDynamicSharedMemorySize, n * 4);
    cudaFuncSetAttribute(load_only, cudaFuncAttributeMaxDynamicSharedMemorySize, n * 4);
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    for (int dist = 0; dist < 4; dist++) {
        std::vector<float> h((size_t)4 * rows * n);
        for (auto& x : h) x = dist == 0 ? nd(rng) : dist == 1 ? expf(nd(rng)) : dist == 2 ? ud(rng) : nd(rng) * 0.5f + (ud(rng) < 0.5f ? 4.f : -4.f);
        cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
        for (int mode = 0; mode < 3; mode++) {
            const int req = mode == 1 ? (int)ceil(0.97 * k) : k;
            auto launch = [&](int i) {
                const float* src = d + (size_t)(i % 4) * rows * n;
                if (mode == 2) load_only<<<rows, TOPK_THREADS, n * 4>>>(src, n, out);
                else topk_rows<<<rows, TOPK_THREADS, n * 4>>>(src, n, k, req, out);
            };
            for (int i = 0; i < 40; i++) launch(i);
            std::vector<float> ts;
            for (int g = 0; g < 30; g++) {
                cudaEventRecord(e0);
                for (int i = 0; i < 20; i++) launch(i);
                cudaEventRecord(e1); cudaEventSynchronize(e1);
                float ms; cudaEventElapsedTime(&ms, e0, e1); ts.push_back(ms * 1000.f / 20);
            }
            std::sort(ts.begin(), ts.end());
            printf("%-10s %-6s %6.1f us", names[dist], mode == 0 ? "exact" : mode == 1 ? "approx" : "load", ts[ts.size() / 2]);
            if (mode < 2) {
                std::vector<long long> dg(256 * 16, 0);
                cudaMemcpyToSymbol(tk_diag, dg.data(), dg.size() * 8);
                launch(0); cudaDeviceSynchronize();
                cudaMemcpyFromSymbol(dg.data(), tk_diag, dg.size() * 8);
                printf("  cycles from start:");
                for (int m = 1; m < 13; m++) {
                    double sum = 0; int c = 0;
                    for (int b = 0; b < rows; b++) if (dg[b * 16 + m]) { sum += dg[b * 16 + m] - dg[b * 16]; c++; }
                    if (c) printf(" [%d]%.0f", m, sum / c);
                }
            }
            printf("\n");
        }
    }
    printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
