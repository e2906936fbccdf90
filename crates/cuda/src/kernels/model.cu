// The element-wise and row kernels of a decoder layer. Defines: HEAD_DIM, PAGE_SIZE, KV_FP8
// (kv_elem.cu is compiled in front), F16_INPUT_SHIFT, RMS_THREADS (a block of rms_norm_rows).
// Activations between layers are f32; GEMM inputs are bf16, or for the fp8 weight products f16
// of the values times 2^-F16_INPUT_SHIFT (raw 16-bit values here).

#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ unsigned short to_bf16(float f) { return kv_f32_to_bf16(f); }

__device__ __forceinline__ float from_bf16(unsigned short h) {
    return __uint_as_float(((unsigned int)h) << 16);
}

// Lets a kernel launched as a dependent of this one (the fp8 weight products) start on the
// multiprocessors this one leaves idle: it loads its weights, then waits for this one to finish
// before it reads what this one writes.
__device__ __forceinline__ void launch_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Sum of `v` over the block (blockDim.x a multiple of 32, at most 1024).
__device__ float block_sum(float v) {
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    const int warps = blockDim.x >> 5;
    v = lane < warps ? part[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// x[r] = embedding row tokens[r] (bf16 table [vocab][hidden]) times `scale`; one block per row.
extern "C" __global__ void embed_rows(const unsigned short* __restrict__ table,
                                      const unsigned int* __restrict__ tokens, int hidden,
                                      float scale, float* __restrict__ x) {
    const unsigned long long src = (unsigned long long)tokens[blockIdx.x] * hidden;
    float* out = x + (unsigned long long)blockIdx.x * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x)
        out[i] = from_bf16(table[src + i]) * scale;
}

// out[r] = input(x[rows[r]] / rms * w); `rows` null means row r itself. One block of
// RMS_THREADS per row. A row of up to RMS_THREADS * 4 * RMS_VEC values, a multiple of 4, is held
// in registers: each thread loads its x and w at once, before the sum, so that the block waits on
// one round of loads (a decode step's few rows leave most of the device idle, and this kernel
// stands between two products).
#define RMS_VEC 8
extern "C" __global__ void __launch_bounds__(RMS_THREADS)
    rms_norm_rows(const float* __restrict__ x, const int* __restrict__ rows,
                  const float* __restrict__ w, int hidden, float eps,
                  unsigned short* __restrict__ out, int f16) {
    launch_dependents();
    const int src = rows ? rows[blockIdx.x] : (int)blockIdx.x;
    const float* xr = x + (unsigned long long)src * hidden;
    unsigned short* o = out + (unsigned long long)blockIdx.x * hidden;
    if ((hidden & 3) == 0 && hidden <= RMS_THREADS * 4 * RMS_VEC) {
        float4 xv[RMS_VEC], wv[RMS_VEC];
        float ss = 0.0f;
        // Past the row, zeros: they add nothing to the sum and are not written.
        const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int j = 0; j < RMS_VEC; j++) {
            const int i = 4 * (threadIdx.x + j * RMS_THREADS);
            const bool in_row = i < hidden;
            xv[j] = in_row ? *(const float4*)(xr + i) : zero;
            wv[j] = in_row ? __ldg((const float4*)(w + i)) : zero;
        }
#pragma unroll
        for (int j = 0; j < RMS_VEC; j++)
            ss += xv[j].x * xv[j].x + xv[j].y * xv[j].y + xv[j].z * xv[j].z + xv[j].w * xv[j].w;
        const float inv = rsqrtf(block_sum(ss) / hidden + eps);
#pragma unroll
        for (int j = 0; j < RMS_VEC; j++) {
            const int i = 4 * (threadIdx.x + j * RMS_THREADS);
            if (i < hidden) {
                const unsigned int lo = to_input(xv[j].x * inv * wv[j].x, f16) |
                                        (unsigned int)to_input(xv[j].y * inv * wv[j].y, f16) << 16;
                const unsigned int hi = to_input(xv[j].z * inv * wv[j].z, f16) |
                                        (unsigned int)to_input(xv[j].w * inv * wv[j].w, f16) << 16;
                *(uint2*)(o + i) = make_uint2(lo, hi);
            }
        }
        return;
    }
    float ss = 0.0f;
#pragma unroll 4
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) ss += xr[i] * xr[i];
    const float inv = rsqrtf(block_sum(ss) / hidden + eps);
#pragma unroll 4
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = to_input(xr[i] * inv * w[i], f16);
}

// x[r] += y[r] / rms(y[r]) * w: a sublayer's output normalised before it joins the residual
// stream (Gemma's norms after attention and after the FFN). One block of RMS_THREADS per row.
extern "C" __global__ void __launch_bounds__(RMS_THREADS)
    rms_norm_add_rows(const float* __restrict__ y, const float* __restrict__ w, int hidden,
                      float eps, float* __restrict__ x) {
    const float* yr = y + (unsigned long long)blockIdx.x * hidden;
    float* xr = x + (unsigned long long)blockIdx.x * hidden;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) ss += yr[i] * yr[i];
    const float inv = rsqrtf(block_sum(ss) / hidden + eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) xr[i] += yr[i] * inv * w[i];
}

// After the fused q|k|v projection of each token (`qkv`: f32 [tokens][(hq + 2 hkv) HEAD_DIM]):
// bias, per-head RMSNorm of q and k (QK-norm), RoPE at the token's position; q goes to `q`
// (f32 [tokens][hq][HEAD_DIM]), k and v into the pool at the token's (page, slot).
// Grid (tokens, hq + 2 hkv), block max(32, HEAD_DIM) threads.
extern "C" __global__ void qkv_post(const float* __restrict__ qkv,
                                    const float* __restrict__ bias,
                                    const float* __restrict__ q_norm,
                                    const float* __restrict__ k_norm, float eps,
                                    const float* __restrict__ inv_freq, int rope_halves,
                                    const int* __restrict__ pos,
                                    const unsigned int* __restrict__ slots, int hq, int hkv,
                                    float* __restrict__ q, kv_t* __restrict__ kpool,
                                    kv_t* __restrict__ vpool) {
    __shared__ float head[HEAD_DIM];
    __shared__ float part[32];
    const int t = blockIdx.x, h = blockIdx.y, i = threadIdx.x;
    const bool live = i < HEAD_DIM;
    const int width = (hq + 2 * hkv) * HEAD_DIM;
    const int col = h * HEAD_DIM + i;
    float v = live ? qkv[(unsigned long long)t * width + col] : 0.0f;
    if (bias && live) v += bias[col];
    const bool is_q = h < hq, is_k = !is_q && h < hq + hkv;
    const float* norm = is_q ? q_norm : (is_k ? k_norm : nullptr);
    if (norm) {
        // The head's values lie over the block's warps: reduce through shared memory.
        float s = v * v;
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if ((i & 31) == 0) part[i >> 5] = s;
        __syncthreads();
        s = 0.0f;
        for (int w = 0; w < (HEAD_DIM + 31) / 32; w++) s += part[w];
        if (live) v *= rsqrtf(s / HEAD_DIM + eps) * norm[i];
    }
    if (is_q || is_k) {
        if (live) head[i] = v;
        __syncthreads();
        const int half = HEAD_DIM / 2;
        int f, partner;
        bool first;
        if (rope_halves) {
            f = i % half;
            first = i < half;
            partner = first ? i + half : i - half;
        } else {
            f = i / 2;
            first = (i & 1) == 0;
            partner = i ^ 1;
        }
        if (live) {
            // The angle in f32 as the CPU computes it; the sine and cosine in double, because
            // fast-math single-precision sin/cos lose accuracy at large angles.
            const float angle = (float)pos[t] * inv_freq[f];
            double sd, cd;
            sincos((double)angle, &sd, &cd);
            const float c = (float)cd, s = (float)sd, other = head[partner];
            v = first ? v * c - other * s : other * s + v * c;
        }
    }
    if (!live) return;
    if (is_q) {
        q[((unsigned long long)t * hq + h) * HEAD_DIM + i] = v;
        return;
    }
    const int kh = is_k ? h - hq : h - hq - hkv;
    const unsigned int page = slots[2 * t], slot = slots[2 * t + 1];
    const unsigned long long dst =
        (((unsigned long long)page * hkv + kh) * PAGE_SIZE + slot) * HEAD_DIM + i;
    (is_k ? kpool : vpool)[dst] = kv_put(v);
}

// out = input(act(gate) * up) from gu = f32 [rows][2 ffn] (gate first, then up); act is SiLU,
// or with `gelu` GELU's tanh approximation (Gemma's).
extern "C" __global__ void gate_mul(const float* __restrict__ gu, int rows, int ffn, int gelu,
                                    unsigned short* __restrict__ out, int f16) {
    launch_dependents();
    const unsigned long long n = (unsigned long long)rows * ffn;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned long long r = i / ffn, c = i % ffn;
        const float g = gu[r * 2 * ffn + c], u = gu[r * 2 * ffn + ffn + c];
        float a;
        if (gelu) {
            const float inner = 0.7978846f * (g + 0.044715f * g * g * g);
            // tanh(y) = 1 - 2 / (e^2y + 1), which saturates to +-1 without a NaN.
            a = 0.5f * g * (2.0f - 2.0f / (__expf(2.0f * inner) + 1.0f));
        } else {
            a = g / (1.0f + __expf(-g));
        }
        out[i] = to_input(a * u, f16);
    }
}

extern "C" __global__ void to_input_kernel(const float* __restrict__ x, unsigned long long n,
                                           unsigned short* __restrict__ out, int f16) {
    launch_dependents();
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        out[i] = to_input(x[i], f16);
}

// x = bf16(x * scale + offset), in place over raw bf16 values (shapes random weights).
extern "C" __global__ void scale_bf16(unsigned short* __restrict__ x, unsigned long long n,
                                      float scale, float offset) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        x[i] = to_bf16(from_bf16(x[i]) * scale + offset);
}
