// Weight matrices stored as fp8 (e4m3) with one f32 scale an output row: w[r][k] = q[r][k] *
// scale[r]. Compiled after kv_elem.cu (for its e4m3 and bf16 roundings), mma.cu and cluster.cu.
//
//   fp8_quantize_rows   bf16 rows -> e4m3 bytes and scales (scale = the row's largest magnitude
//                       / 448, rounded as the host's quantizer rounds)
//   fp8_dequantize      a range of rows -> bf16 (for products of many rows, through cuBLAS)
//   fp8_matmul_<NT>     out[t][r] (+)= sum_k x[t][k] w[r][k] for at most 8 NT rows of x, on the
//   fp8_matmul_tall_<NT> tensor cores (tall_: up to 16 rows by a matrix of many row blocks): a
//                       decode step's products read half the bytes of bf16. x arrives as f16
//                       of its values times 2^-F16_INPUT_SHIFT (activations up to 65504 *
//                       2^8, about 1.7e7, stay finite at the shift of 8), so that the weights
//                       widen to f16 in one instruction a pair.
//
// Defines: FP8_WARPS_FEW, FP8_WARPS_MANY (warps a block, 2, 4 or 8, splitting its k, in the
// products of up to 16 and of more rows of x), FP8_WARPS_TALL (the same for up to 16 rows by a
// matrix of many row blocks), FP8_DEPTH (chunks of weights a warp keeps in flight),
// F16_INPUT_SHIFT (x's power of two, from the host: model.cu writes x with the same). A product
// whose k is split over the blocks of a row tile (grid y) adds their sums in cluster shared
// memory where the host launched each tile's blocks as one cluster, through `work` otherwise.
// Output rows a block owns: two 16-row tiles, so that each x fragment feeds two products.
#define FP8_ROWS 32
// Weights a warp takes at a time along k: 16 bytes from each lane of a quad.
#define FP8_CHUNK 64

extern "C" __global__ void __launch_bounds__(256) fp8_quantize_rows(
    const unsigned short* __restrict__ w, int cols, unsigned char* __restrict__ q,
    float* __restrict__ scale) {
    const unsigned short* row = w + (size_t)blockIdx.x * cols;
    float m = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        m = fmaxf(m, fabsf(__uint_as_float((unsigned int)row[i] << 16)));
    }
    __shared__ float warp_max[8];
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
    __syncthreads();
    m = 0.0f;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) m = fmaxf(m, warp_max[i]);
    // Correctly rounded, whatever the compile options, so that the host's quantizer agrees.
    const float inv = m > 0.0f ? __fdiv_rn(448.0f, m) : 0.0f;
    if (threadIdx.x == 0) scale[blockIdx.x] = __fdiv_rn(m, 448.0f);
    unsigned char* out = q + (size_t)blockIdx.x * cols;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        out[i] = kv_f32_to_fp8(__fmul_rn(__uint_as_float((unsigned int)row[i] << 16), inv));
    }
}

// Rows [row0, row0 + rows) of `q` -> bf16 into `out` (`rows` x `cols`).
extern "C" __global__ void fp8_dequantize(const unsigned char* __restrict__ q,
                                          const float* __restrict__ scale, long long row0,
                                          long long rows, int cols,
                                          unsigned short* __restrict__ out) {
    const long long n = rows * cols;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const long long r = row0 + i / cols;
        out[i] = kv_f32_to_bf16(kv_fp8_to_f32(q[row0 * cols + i]) * scale[r]);
    }
}

// Two e4m3 weights, the low 16 bits of `w` (k, then k + 1), -> f16x2 of their values times
// 2^-FP8_W_SHIFT. Weights hold no NaN.
#if __CUDA_ARCH__ >= 890
#define FP8_W_SHIFT 0
__device__ __forceinline__ unsigned int fp8_pair(unsigned int w) { return e4m3x2_f16x2(w); }
#else
// Without the conversion instruction: the magnitude bits moved into an f16's exponent and
// mantissa are the value times 2^-8, e4m3's subnormals included.
#define FP8_W_SHIFT 8
__device__ __forceinline__ unsigned int fp8_pair(unsigned int w) {
    const unsigned int x = __byte_perm(w, 0u, 0x4140u);
    return ((x & 0x007f007fu) << 7) | ((x & 0x00800080u) << 8);
}
#endif

__device__ __forceinline__ uint4 fp8_stream(const unsigned char* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

__device__ __forceinline__ unsigned int fp8_word(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// The rank of a cluster that finishes output i of a tile split over `splits` blocks: whole warps
// of outputs, in turn.
__device__ __forceinline__ unsigned int fp8_owner(int i, int splits) {
    return (unsigned int)((i >> 5) % splits);
}

// A block owns FP8_ROWS output rows and chunk range [c0, c1) along k, its W warps taking every
// W-th chunk (so that the block reads W neighbouring chunks of each row at a time). Within a
// chunk, lane (g, q) of a warp (g = lane / 4, q = lane % 4) loads 16 weights at k = 16 q .. 16 q
// + 15 of rows g and g + 8 of each 16-row tile; step s of the chunk gives the product's logical
// columns 2q, 2q + 1 the weights at 16q + 4s + {0, 1} and columns 2q + 8, 2q + 9 those at
// 16q + 4s + {2, 3}. x's fragments follow the same order along k, so the sum over k is the same.
template <int NT, int W>
__device__ __forceinline__ void fp8_matmul_body(
    const unsigned char* __restrict__ w, const float* __restrict__ scale,
    const unsigned short* __restrict__ x, float* __restrict__ out, int rows, int cols, int n,
    int accumulate, float* __restrict__ work, unsigned int* __restrict__ counters) {
    constexpr int TILE = FP8_ROWS * NT * 8, THREADS = W * 32;
    constexpr int SLOTS = W < 4 ? W : 4;
    __shared__ float part[SLOTS][TILE];
    __shared__ int last;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int row0 = blockIdx.x * FP8_ROWS;
    const int splits = gridDim.y, chunks = cols / FP8_CHUNK;
    const int c0 = (int)((long long)chunks * blockIdx.y / splits);
    const int c1 = (int)((long long)chunks * (blockIdx.y + 1) / splits);

    const unsigned char* wp[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = min(row0 + mt * 16 + h * 8 + g, rows - 1);
            wp[mt][h] = w + (size_t)r * cols + 16 * q;
        }
    }
    const unsigned short* xp[NT];
    bool xok[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int t = nt * 8 + g;
        xok[nt] = t < n;
        xp[nt] = x + (size_t)min(t, n - 1) * cols + 16 * q;
    }
    float acc[2][NT][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.0f;

    // This warp's chunks are first + j W; buf[i] holds one of every FP8_DEPTH in flight.
    const int first = c0 + warp, stride = FP8_DEPTH * W;
    uint4 buf[FP8_DEPTH][2][2];
#pragma unroll
    for (int i = 0; i < FP8_DEPTH; i++) {
        const int c = first + i * W;
        if (c < c1) {
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    buf[i][mt][h] = fp8_stream(wp[mt][h] + (size_t)c * FP8_CHUNK);
        }
    }
    // Launched as a dependent: the weights above do not depend on the kernel ahead; x, `out`
    // and the split counters do.
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    for (int base = first; base < c1; base += stride) {
#pragma unroll
        for (int i = 0; i < FP8_DEPTH; i++) {
            const int c = base + i * W;
            if (c >= c1) break;
            // This lane's 16 values of x along the chunk, for each tile of 8 rows of x.
            uint4 xa[NT][2];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const uint4* p = (const uint4*)(xp[nt] + (size_t)c * FP8_CHUNK);
                xa[nt][0] = xok[nt] ? __ldg(p) : make_uint4(0u, 0u, 0u, 0u);
                xa[nt][1] = xok[nt] ? __ldg(p + 1) : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
            for (int s = 0; s < 4; s++) {
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    const unsigned int lo = fp8_word(buf[i][mt][0], s);
                    const unsigned int hi = fp8_word(buf[i][mt][1], s);
                    const unsigned int a0 = fp8_pair(lo), a1 = fp8_pair(hi);
                    const unsigned int a2 = fp8_pair(lo >> 16), a3 = fp8_pair(hi >> 16);
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) {
                        const uint4& xv = xa[nt][s >> 1];
                        const unsigned int b0 = (s & 1) ? xv.z : xv.x, b1 = (s & 1) ? xv.w : xv.y;
                        mma_f16(acc[mt][nt], a0, a1, a2, a3, b0, b1);
                    }
                }
            }
            const int next = c + stride;
            if (next < c1) {
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        buf[i][mt][h] = fp8_stream(wp[mt][h] + (size_t)next * FP8_CHUNK);
            }
        }
    }

    // Warps 4-7 (if any) leave their sums in part[warp - 4], warps 0-3 add theirs, then each
    // thread adds the slots: a fixed order.
    // part[.][token * FP8_ROWS + row]; a fragment holds rows g, g + 8 and tokens 2q, 2q + 1.
    constexpr int ROUNDS = W / SLOTS;
    for (int round = 0; round < ROUNDS; round++) {
        if (warp / SLOTS == ROUNDS - 1 - round) {
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const int r = mt * 16 + g + (i >> 1) * 8, t = nt * 8 + 2 * q + (i & 1);
                        float* p = &part[warp % SLOTS][t * FP8_ROWS + r];
                        *p = round ? *p + acc[mt][nt][i] : acc[mt][nt][i];
                    }
        }
        __syncthreads();
    }
    // Each thread finishes MINE outputs: i = threadIdx.x + j * THREADS.
    constexpr int MINE = TILE / THREADS;
    float v[MINE];
#pragma unroll
    for (int j = 0; j < MINE; j++) {
        const int i = threadIdx.x + j * THREADS;
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < SLOTS; k++) sum += part[k][i];
        v[j] = sum;
    }
#if __CUDA_ARCH__ >= 900
    // Launched in clusters of a row tile's split blocks (block y of the tile is rank y): each
    // leaves its sums in its shared memory, and each output's owner adds all ranks' in rank
    // order, the same sum as through `work` below.
    const bool clustered = splits > 1 && cluster_ranks() == (unsigned int)splits;
    const unsigned int rank = blockIdx.y;
    if (clustered) {
        // A thread rewrites only the outputs it has just read.
#pragma unroll
        for (int j = 0; j < MINE; j++) part[0][threadIdx.x + j * THREADS] = v[j];
        cluster_sync();
#pragma unroll
        for (int j = 0; j < MINE; j++) {
            const int i = threadIdx.x + j * THREADS;
            if (fp8_owner(i, splits) == rank) {
                float sum = 0.0f;
                for (int s = 0; s < splits; s++) sum += load_f32(&part[0][i], s);
                v[j] = sum;
            }
        }
        // The other ranks' shared memory stays until every owner has read it.
        cluster_sync();
    } else
#else
    const bool clustered = false;
    const unsigned int rank = 0;
#endif
    if (splits > 1) {
        // The blocks of a row tile leave their sums in `work`; the last to finish adds them in
        // order (the same sum whichever block is last) and resets the tile's counter.
        float* mine = work + ((size_t)blockIdx.x * splits + blockIdx.y) * TILE;
#pragma unroll
        for (int j = 0; j < MINE; j++) mine[threadIdx.x + j * THREADS] = v[j];
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) last = atomicAdd(&counters[blockIdx.x], 1u) == (unsigned)splits - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();
        const float* tile = work + (size_t)blockIdx.x * splits * TILE;
#pragma unroll
        for (int j = 0; j < MINE; j++) {
            const int i = threadIdx.x + j * THREADS;
            float sum = 0.0f;
            for (int s = 0; s < splits; s++) sum += __ldcg(tile + (size_t)s * TILE + i);
            v[j] = sum;
        }
        if (threadIdx.x == 0) counters[blockIdx.x] = 0u;
    }
#pragma unroll
    for (int j = 0; j < MINE; j++) {
        const int i = threadIdx.x + j * THREADS;
        const int r = row0 + i % FP8_ROWS, t = i / FP8_ROWS;
        if (r < rows && t < n && (!clustered || fp8_owner(i, splits) == rank)) {
            // x's and the weights' powers of two undone: exact.
            const float y = v[j] * scale[r] * (float)(1 << (F16_INPUT_SHIFT + FP8_W_SHIFT));
            float* o = out + (size_t)t * rows + r;
            *o = accumulate ? *o + y : y;
        }
    }
}

#define FP8_MATMUL(NT, W)                                                                      \
    extern "C" __global__ void __launch_bounds__(W * 32) fp8_matmul_##NT(                       \
        const unsigned char* __restrict__ w, const float* __restrict__ scale,                   \
        const unsigned short* __restrict__ x, float* __restrict__ out, int rows, int cols,      \
        int n, int accumulate, float* __restrict__ work, unsigned int* __restrict__ counters) { \
        fp8_matmul_body<NT, W>(w, scale, x, out, rows, cols, n, accumulate, work, counters);   \
    }
FP8_MATMUL(1, FP8_WARPS_FEW)
FP8_MATMUL(2, FP8_WARPS_FEW)
FP8_MATMUL(4, FP8_WARPS_MANY)
FP8_MATMUL(8, FP8_WARPS_MANY)

// Up to 16 rows of x by a matrix of many row blocks a multiprocessor.
#define FP8_MATMUL_TALL(NT)                                                                    \
    extern "C" __global__ void __launch_bounds__(FP8_WARPS_TALL * 32) fp8_matmul_tall_##NT(    \
        const unsigned char* __restrict__ w, const float* __restrict__ scale,                   \
        const unsigned short* __restrict__ x, float* __restrict__ out, int rows, int cols,      \
        int n, int accumulate, float* __restrict__ work, unsigned int* __restrict__ counters) { \
        fp8_matmul_body<NT, FP8_WARPS_TALL>(w, scale, x, out, rows, cols, n, accumulate, work, \
                                            counters);                                          \
    }
FP8_MATMUL_TALL(1)
FP8_MATMUL_TALL(2)
