// What the weight products read (blas.rs's Input), written by the kernels in front of them.
// Defines: F16_INPUT_SHIFT; kv_elem.cu is compiled in front.

// A product's input: bf16, or (`f16`) f16 of the value times 2^-F16_INPUT_SHIFT, as
// fp8_matmul.cu takes it. Past f16's range the value saturates rather than becoming infinite
// (NaN stays NaN).
__device__ __forceinline__ unsigned short to_input(float f, int f16) {
    if (!f16) return kv_f32_to_bf16(f);
    float s = f * (1.0f / (float)(1 << F16_INPUT_SHIFT));
    s = fabsf(s) > 65504.0f ? copysignf(65504.0f, s) : s;
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(s));
    return h;
}
