// Probe: gathering 67 MB of page summaries (16 seqs x 2048 shuffled pages x 8 heads x 256 B)
// in the tensor-core scorer's tile pattern, with G adjacent KV heads read together. Stored
// [page][head][256 B], a block takes one group of G heads of a sequence and 1/G of its pages, so
// its warps read pieces of G x 256 B and the grid stays 128 blocks (one a multiprocessor). G = 1
// is the shipped row pattern over page-major storage; the head-major row pattern is timed beside
// it. Run: nvcc -O3 -arch=sm_90 -o groups groups.cu && ./groups
#include <cstdio>
#include <vector>
#include <random>
#include <algorithm>
#include <cuda_runtime.h>
constexpr int SEQS = 16, HEADS = 8, PAGES = 2048, NP = SEQS * PAGES, VEC = 16;

// Warp w reads head (w % G) of the group's 16-page tiles, tile parity w / G.
template <int G, bool PREF, bool HEAD_MAJOR>
__global__ void __launch_bounds__(512) groups(const uint4* __restrict__ buf, const unsigned* __restrict__ ids, unsigned* out) {
  constexpr int PER = PAGES / G, WARPS = 16, PAR = WARPS / G;
  const int seq = blockIdx.x / HEADS, grp = (blockIdx.x % HEADS) / G, chunk = blockIdx.x % G;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int head = grp * G + warp % G, par = warp / G;
  const unsigned* rid = ids + seq * PAGES + chunk * PER;
  auto piece = [&](unsigned p) {
    return HEAD_MAJOR ? buf + ((size_t)head * NP + p) * VEC : buf + ((size_t)p * HEADS + head) * VEC;
  };
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (int tile = par; tile < PER / 16; tile += PAR) {
    uint4 x[2][4];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const uint4* row = piece(rid[tile * 16 + g + 8 * h]) + t;
#pragma unroll
      for (int c = 0; c < 4; c++) x[h][c] = __ldg(row + 4 * c);
    }
    if (PREF && tile + PAR < PER / 16) {
      const char* row = reinterpret_cast<const char*>(piece(rid[(tile + PAR) * 16 + g + 8 * (t & 1)]));
      asm volatile("prefetch.global.L2 [%0];" ::"l"(row + 128 * (t >> 1)));
    }
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
      for (int c = 0; c < 4; c++) { acc.x ^= x[h][c].x; acc.y ^= x[h][c].y; acc.z ^= x[h][c].z; acc.w ^= x[h][c].w; }
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
  uint4* buf; unsigned *ids, *out;
  cudaMalloc(&buf, bytes); cudaMemset(buf, 1, bytes);
  cudaMalloc(&ids, NP * 4); cudaMalloc(&out, 4096);
  std::vector<unsigned> h(NP); for (int i = 0; i < NP; i++) h[i] = i;
  std::mt19937 rng(1); std::shuffle(h.begin(), h.end(), rng);
  cudaMemcpy(ids, h.data(), NP * 4, cudaMemcpyHostToDevice);
  float t;
#define RUN(name, kernel) t = timeit([&] { kernel<<<128, 512>>>(buf, ids, out); }); printf("%-44s %6.1f us %5.0f GB/s\n", name, t, bytes / t / 1e3);
  for (int rep = 0; rep < 2; rep++) {
    RUN("rows, head-major, L2 prefetch (shipped)", (groups<1, true, true>));
    RUN("rows, page-major, L2 prefetch", (groups<1, true, false>));
    RUN("pairs (512 B), L2 prefetch", (groups<2, true, false>));
    RUN("pairs (512 B)", (groups<2, false, false>));
    RUN("fours (1 KB), L2 prefetch", (groups<4, true, false>));
    RUN("eights (2 KB), L2 prefetch", (groups<8, true, false>));
  }
  printf("%s\n", cudaGetErrorString(cudaGetLastError()));
}
