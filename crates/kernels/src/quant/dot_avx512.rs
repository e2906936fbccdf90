//! The quantized formats with AVX-512 VNNI on 256-bit vectors: `vpdpbusd` replaces AVX2's
//! `maddubs` + `madd` for the 32-element formats, `vpdpwssd` the `madd` + `add` of the K-quants.
//! (On Zen 4, 512-bit integer ops run at half rate, so wider vectors would not add throughput.)
//! Float weights take `dot_float512`'s tiles.

use core::arch::x86_64::*;

use super::dot_avx2::{
    PairActs, PairWeights, Q4_0, Q4_1, Q5_0, Q8_0, block32_bytes, block32_kernels, broadcast_i16,
    f16_pair, hsum_ps, hsum_ps128, k_quant_kernels, pair_acts, pair_scales, pair_values,
    q4_k_scales_mins, q5_0_high_masks,
};
use super::dot_scalar::{blocks, pairs};
use super::q8::{BlockQ8K, BlockQ8x2};

/// Weight values of a pair, ready for [`pair_dot`]: unsigned bytes, Q8_0's offset by 128.
///
/// # Safety
/// `p0` and `p1` must be valid for reading a block of `KIND`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pair_weights<const KIND: u8>(p0: *const u8, p1: *const u8) -> (__m256i, __m256i) {
    // SAFETY: the caller guarantees whole blocks.
    let (lo, hi) = unsafe { pair_values::<KIND>(p0, p1) };
    match KIND {
        Q5_0 => {
            // SAFETY: as above.
            let (mlo, mhi) = unsafe { q5_0_high_masks(p0, p1) };
            let bit4 = _mm256_set1_epi8(0x10);
            (
                _mm256_mask_add_epi8(lo, mlo, lo, bit4),
                _mm256_mask_add_epi8(hi, mhi, hi, bit4),
            )
        }
        Q8_0 => {
            let flip = _mm256_set1_epi8(i8::MIN);
            (_mm256_xor_si256(lo, flip), _mm256_xor_si256(hi, flip))
        }
        _ => (lo, hi),
    }
}

/// `Σ (q - offset) y` of two weight blocks (from [`pair_weights`]) with an activation pair:
/// block A in lanes 0..4, B in lanes 4..8. The offset (8, 16, or 128 for the shifted Q8_0
/// values) enters as the accumulator's starting value, a multiple of the activation sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn pair_dot<const KIND: u8>(lo: __m256i, hi: __m256i, y: &PairActs) -> __m256i {
    let start = match KIND {
        Q4_0 => y.bias,
        Q5_0 => _mm256_slli_epi32::<1>(y.bias),
        Q8_0 => _mm256_slli_epi32::<4>(y.bias),
        _ => _mm256_setzero_si256(),
    };
    _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(start, lo, y.lo), hi, y.hi)
}

block32_kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni");

/// `acc` plus the sums of adjacent products of i16 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn madd_acc(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    _mm256_dpwssd_epi32(acc, a, b)
}

k_quant_kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni");
