// Probe: gathering the 256-byte page summaries of 128 (sequence, KV head) rows, stored
// head-major [head][page][256 B] (as the pool stores them) or page-major [page][head][256 B]
// (a page's 8 heads adjacent). Pages shuffled over the pool, then in order. Run:
// nvcc -O3 -arch=sm_90 -o gather gather.cu && ./gather
#include <cstdio>
#include <vector>
#include <random>
#include <algorithm>
#include <cuda_runtime.h>
constexpr int SEQS = 16, HEADS = 8, PAGES = 2048, NP = SEQS * PAGES, VEC = 16;  // 16 x 16 B
template <bool PAGE_MAJOR, int UNROLL>
__global__ void __launch_bounds__(512) gather(const uint4* __restrict__ buf, const unsigned* __restrict__ ids, unsigned* out) {
  const int seq = blockIdx.x / HEADS, head = blockIdx.x % HEADS;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, half = lane >> 4, v = lane & 15;
  const unsigned* rid = ids + seq * PAGES;
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (int base = warp * 2 * UNROLL; base < PAGES; base += 16 * 2 * UNROLL) {
    uint4 x[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
      const unsigned p = rid[base + 2 * u + half];
      const size_t o = PAGE_MAJOR ? ((size_t)p * HEADS + head) * VEC + v : ((size_t)head * NP + p) * VEC + v;
      x[u] = __ldg(buf + o);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; u++) { acc.x ^= x[u].x; acc.y ^= x[u].y; acc.z ^= x[u].z; acc.w ^= x[u].w; }
  }
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x12345678u) out[blockIdx.x] = 1;
}
template <class F> float timeit(F f) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int i = 0; i < 5; i++) f();
  std::vector<float> t;
  for (int r = 0; r < 21; r++) {
    cudaEventRecord(a); for (int i = 0; i < 20; i++) f(); cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b); t.push_back(ms * 1000 / 20);
  }
  std::sort(t.begin(), t.end()); return t[10];
}
int main() {
  const size_t bytes = (size_t)NP * HEADS * 256;
  uint4* buf; unsigned *ids, *out; void* dst;
  cudaMalloc(&buf, bytes); cudaMalloc(&dst, bytes); cudaMemset(buf, 1, bytes);
  cudaMalloc(&ids, NP * 4); cudaMalloc(&out, 1024);
  std::vector<unsigned> h(NP); for (int i = 0; i < NP; i++) h[i] = i;
  std::mt19937 rng(1); std::shuffle(h.begin(), h.end(), rng);
  cudaMemcpy(ids, h.data(), NP * 4, cudaMemcpyHostToDevice);
  const double mb = bytes / 1e6;
  float c = timeit([&] { cudaMemcpyAsync(dst, buf, bytes, cudaMemcpyDeviceToDevice); });
  printf("copy %.1f MB: %.1f us, %.0f GB/s (read + write)\n", mb, c, 2 * bytes / c / 1e3);
  float t;
  t = timeit([&] { gather<false, 1><<<SEQS * HEADS, 512>>>(buf, ids, out); }); printf("head-major u1: %.1f us %.0f GB/s\n", t, bytes / t / 1e3);
  t = timeit([&] { gather<false, 4><<<SEQS * HEADS, 512>>>(buf, ids, out); }); printf("head-major u4: %.1f us %.0f GB/s\n", t, bytes / t / 1e3);
  t = timeit([&] { gather<true, 1><<<SEQS * HEADS, 512>>>(buf, ids, out); }); printf("page-major u1: %.1f us %.0f GB/s\n", t, bytes / t / 1e3);
  t = timeit([&] { gather<true, 4><<<SEQS * HEADS, 512>>>(buf, ids, out); }); printf("page-major u4: %.1f us %.0f GB/s\n", t, bytes / t / 1e3);
  // sequential pages (as after a prefill): ids in order
  for (int i = 0; i < NP; i++) h[i] = i;
  cudaMemcpy(ids, h.data(), NP * 4, cudaMemcpyHostToDevice);
  t = timeit([&] { gather<false, 4><<<SEQS * HEADS, 512>>>(buf, ids, out); }); printf("sequential head-major u4: %.1f us %.0f GB/s\n", t, bytes / t / 1e3);
  t = timeit([&] { gather<true, 4><<<SEQS * HEADS, 512>>>(buf, ids, out); }); printf("sequential page-major u4: %.1f us %.0f GB/s\n", t, bytes / t / 1e3);
  printf("%s\n", cudaGetErrorString(cudaGetLastError()));
}
