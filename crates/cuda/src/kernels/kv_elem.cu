// The KV pool's element type, compiled in front of every kernel that reads or writes the pool.
// Define: KV_FP8 (1: fp8 e4m3 with no scale, 0: bf16).
//   kv_t     one stored element (raw bits)
//   kv_vec   8 consecutive stored elements, one vector load
//   kv_put   f32 -> stored element, rounded to nearest even (fp8: finite values past 448
//            saturate to 448, as vLLM's unscaled e4m3 cache does)
//   kv_get   stored element -> f32 (exact)
//   kv_unpack8 kv_vec -> 8 f32 (exact)
//   kv_zero    a kv_vec of zeros
//   kv_pair    elements 2w, 2w + 1 of a row -> 2 packed bf16 (exact: every e4m3 value is a
//              bf16 value)
// Whatever the pool stores: kv_f32_to_bf16, kv_f32_to_fp8, kv_fp8_to_f32, kv_fp8x2_to_bf16x2,
// e4m3x2_f16x2.
// Every decoding path reads 0x7f and 0xff (written only for a NaN) as NaN.

#ifndef KV_FP8
#error "KV_FP8 must be defined: a pool read with the wrong element type would go unnoticed"
#endif

__device__ __forceinline__ unsigned short kv_f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

// e4m3 (bias 7, no infinities, 0x7f the NaN); the same rounding as the host's fp8.rs.
__device__ __forceinline__ unsigned char kv_f32_to_fp8(float x) {
    const unsigned int u = __float_as_uint(x);
    const unsigned int s = (u >> 24) & 0x80u;
    const unsigned int a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (unsigned char)(s | 0x7fu);
    if (a > 0x43e00000u) return (unsigned char)(s | 0x7eu);  // past 448
    if (a < 0x3c800000u) {                                    // below 2^-6: steps of 2^-9
        return (unsigned char)(s | (unsigned int)__float2int_rn(__uint_as_float(a) * 512.0f));
    }
    const unsigned int r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;  // 8 exponent, 3 mantissa bits
    return (unsigned char)(s | (((r >> 3) - 120u) << 3) | (r & 7u));
}

__device__ __forceinline__ float kv_fp8_to_f32(unsigned int b) {
    if ((b & 0x7fu) == 0x7fu) return __uint_as_float(0x7fc00000u | ((b & 0x80u) << 24));
    const unsigned int e = (b >> 3) & 15u, m = b & 7u;
    const float mag = e ? __uint_as_float(((e + 120u) << 23) | (m << 20)) : (float)m * 0.001953125f;
    return (b & 0x80u) ? -mag : mag;
}

// Two e4m3 values in the low bytes of each half of `t` -> two bf16. The magnitude bits moved to
// a bf16's exponent and mantissa give the value times 2^-120 (a bf16 subnormal when e = 0), and
// one bf16 product by 2^120 scales it back exactly.
__device__ __forceinline__ unsigned int kv_fp8x2_to_bf16x2(unsigned int t) {
    const unsigned int x = ((t & 0x007f007fu) << 4) | ((t & 0x00800080u) << 8);
#if __CUDA_ARCH__ >= 800
    unsigned int r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(x), "r"(0x7b807b80u), "r"(0x80008000u));
    // The NaN byte came out as 480: make it a bf16 NaN, keeping its sign.
    return r | (__vcmpeq2(t & 0x007f007fu, 0x007f007fu) & 0x7fc07fc0u);
#else
    const unsigned int lo = __float_as_uint(kv_fp8_to_f32(t & 0xffu)) >> 16;
    const unsigned int hi = __float_as_uint(kv_fp8_to_f32((t >> 16) & 0xffu)) >> 16;
    return lo | (hi << 16);
#endif
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
// The e4m3 pair in the low 16 bits of `w` -> f16x2 (exact; the NaN byte stays NaN). Compute
// capability 8.9 or later.
__device__ __forceinline__ unsigned int e4m3x2_f16x2(unsigned int w) {
    unsigned int r;
    asm("{.reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;}"
        : "=r"(r)
        : "r"(w));
    return r;
}
#endif

#if KV_FP8
typedef unsigned char kv_t;
typedef uint2 kv_vec;
__device__ __forceinline__ kv_t kv_put(float x) { return kv_f32_to_fp8(x); }
__device__ __forceinline__ float kv_get(kv_t b) { return kv_fp8_to_f32(b); }

// Four e4m3 values (little-endian in `w`) -> f32. From compute capability 8.9 the hardware
// widens two at a time to f16 (exact: e4m3 lies within f16's normal range), then each to f32.
// On the H200 this beats widening with full-rate integer and f32 instructions (3.75 a value):
// dense fp8 attention at 32K, batch 16, 4 query heads per KV head, 406 against 564 us.
__device__ __forceinline__ void kv_fp8x4_to_f32(unsigned int w, float* f) {
#if __CUDA_ARCH__ >= 890
    asm("{\n .reg .b16 lo, hi, a0, a1, b0, b1;\n .reg .b32 p, q;\n"
        " mov.b32 {lo, hi}, %4;\n"
        " cvt.rn.f16x2.e4m3x2 p, lo;\n cvt.rn.f16x2.e4m3x2 q, hi;\n"
        " mov.b32 {a0, a1}, p;\n mov.b32 {b0, b1}, q;\n"
        " cvt.f32.f16 %0, a0;\n cvt.f32.f16 %1, a1;\n cvt.f32.f16 %2, b0;\n cvt.f32.f16 %3, b1;\n}"
        : "=f"(f[0]), "=f"(f[1]), "=f"(f[2]), "=f"(f[3])
        : "r"(w));
#else
#pragma unroll
    for (int i = 0; i < 4; i++) f[i] = kv_fp8_to_f32((w >> (8 * i)) & 0xffu);
#endif
}

__device__ __forceinline__ void kv_unpack8(kv_vec w, float* f) {
    kv_fp8x4_to_f32(w.x, f);
    kv_fp8x4_to_f32(w.y, f + 4);
}
__device__ __forceinline__ kv_vec kv_zero() { return make_uint2(0, 0); }

__device__ __forceinline__ unsigned int kv_pair(const kv_t* row, int w) {
    return kv_fp8x2_to_bf16x2(
        __byte_perm(reinterpret_cast<const unsigned short*>(row)[w], 0, 0x4140));
}
#else
typedef unsigned short kv_t;
typedef uint4 kv_vec;
__device__ __forceinline__ kv_t kv_put(float x) { return kv_f32_to_bf16(x); }
__device__ __forceinline__ float kv_get(kv_t b) { return __uint_as_float((unsigned int)b << 16); }
__device__ __forceinline__ void kv_unpack8(kv_vec w, float* f) {
    f[0] = __uint_as_float(w.x << 16);
    f[1] = __uint_as_float(w.x & 0xffff0000u);
    f[2] = __uint_as_float(w.y << 16);
    f[3] = __uint_as_float(w.y & 0xffff0000u);
    f[4] = __uint_as_float(w.z << 16);
    f[5] = __uint_as_float(w.z & 0xffff0000u);
    f[6] = __uint_as_float(w.w << 16);
    f[7] = __uint_as_float(w.w & 0xffff0000u);
}
__device__ __forceinline__ kv_vec kv_zero() { return make_uint4(0, 0, 0, 0); }
__device__ __forceinline__ unsigned int kv_pair(const kv_t* row, int w) {
    return reinterpret_cast<const unsigned int*>(row)[w];
}
#endif
