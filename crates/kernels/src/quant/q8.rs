//! 8-bit quantization of activations, the integer side of the quantized dot products.
//!
//! Both formats are symmetric: `d = max|x| / 127`, `q = round_half_even(x * (1 / d))`, so each
//! element is off by at most `d / 2`, a relative error of at most 1/254 of the block's largest
//! magnitude. The AVX2 and scalar versions give identical blocks.

use super::isa::IsaLevel;
use super::types::{QK, QK_K};

/// Two consecutive blocks of 32 activations, A and B, for the Q4_0 / Q4_1 / Q5_0 / Q8_0 dots
/// (ggml's q8_1, two at a time). The values are interleaved by halves, `lo` = A[0..16] B[0..16]
/// and `hi` = A[16..32] B[16..32], which is how two nibble-packed weight blocks unpack: one
/// 256-bit multiply-add then covers two blocks, leaving block A in its four low i32 lanes and B in
/// the four high ones. A row with an odd number of blocks ends with an all-zero B.
#[repr(C, align(32))]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ8x2 {
    pub lo: [i8; QK],
    pub hi: [i8; QK],
    /// `-2 Σ qs` of A in lanes 0..4 and of B in lanes 4..8: four lanes of one block sum to
    /// `-8 Σ qs`, the offset of a Q4_0 value (8) times the activation sum. Other offsets are
    /// power-of-two multiples.
    pub bias: [i32; 8],
    pub d: [f32; 2],
    /// `d * Σ qs` of each block: what the minimum of a Q4_1 block multiplies.
    pub s: [f32; 2],
}

/// 256 activations for the Q4_K / Q6_K dots (ggml's q8_K).
#[repr(C, align(32))]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ8K {
    pub qs: [i8; QK_K],
    /// Sum of each 16 consecutive `qs`.
    pub bsums: [i16; QK_K / 16],
    /// Sum of each 32 consecutive `qs` (a Q4_K sub-block's).
    pub bsums32: [i16; QK_K / 32],
    pub d: f32,
}

impl BlockQ8x2 {
    pub const ZERO: BlockQ8x2 = BlockQ8x2 {
        lo: [0; QK],
        hi: [0; QK],
        bias: [0; 8],
        d: [0.0; 2],
        s: [0.0; 2],
    };

    /// Values, `d` and `Σ qs` of block `h` (0: A, 1: B).
    pub fn block(&self, h: usize) -> ([i8; QK], f32, i32) {
        let mut qs = [0; QK];
        qs[..16].copy_from_slice(&self.lo[16 * h..16 * h + 16]);
        qs[16..].copy_from_slice(&self.hi[16 * h..16 * h + 16]);
        (qs, self.d[h], -self.bias[4 * h] / 2)
    }

    /// Stores block `h` (0: A, 1: B): its values, scale and value sum.
    fn set_block(&mut self, h: usize, qs: &[i8; QK], d: f32, sum: i32) {
        self.lo[16 * h..16 * h + 16].copy_from_slice(&qs[..16]);
        self.hi[16 * h..16 * h + 16].copy_from_slice(&qs[16..]);
        self.bias[4 * h..4 * h + 4].fill(-2 * sum);
        self.d[h] = d;
        self.s[h] = d * sum as f32;
    }
}

impl BlockQ8K {
    pub const ZERO: BlockQ8K = BlockQ8K {
        qs: [0; QK_K],
        bsums: [0; QK_K / 16],
        bsums32: [0; QK_K / 32],
        d: 0.0,
    };
}

/// `d` and `1 / d` for a block whose largest magnitude is `amax`.
#[inline]
fn scales(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    // A d so small that 1 / d overflows quantizes the block to zeros, as d = 0 does.
    let id = 1.0 / d;
    (d, if d > 0.0 && id.is_finite() { id } else { 0.0 })
}

/// Quantizes `x` (a whole number of 32-blocks) into `out`, two blocks per [`BlockQ8x2`]
/// (`out.len()` is half the number of blocks, rounded up).
pub fn quantize_q8(level: IsaLevel, x: &[f32], out: &mut [BlockQ8x2]) {
    let nb = x.len() / QK;
    assert!(
        x.len().is_multiple_of(QK) && out.len() == nb.div_ceil(2),
        "quantize_q8: length mismatch"
    );
    for (b, x) in x.chunks_exact(QK).enumerate() {
        let (qs, d, sum) = quantize_block(level, x);
        out[b / 2].set_block(b % 2, &qs, d, sum);
    }
    if nb % 2 == 1 {
        out[nb / 2].set_block(1, &[0; QK], 0.0, 0);
    }
}

/// Values, scale and value sum of one block of 32.
#[inline]
fn quantize_block(level: IsaLevel, x: &[f32]) -> ([i8; QK], f32, i32) {
    #[cfg(target_arch = "x86_64")]
    if level != IsaLevel::Scalar {
        // SAFETY: every level above Scalar includes AVX2; `x` holds 32 elements.
        return unsafe { avx2::quantize_block(x.as_ptr()) };
    }
    let _ = level;
    let (d, id) = scales(scalar::amax(x));
    let mut qs = [0; QK];
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = scalar::round(v, id);
    }
    (qs, d, qs.iter().map(|&q| q as i32).sum())
}

/// Quantizes `x` (a whole number of 256-blocks) into `out`, one block per 256 elements.
pub fn quantize_q8k(level: IsaLevel, x: &[f32], out: &mut [BlockQ8K]) {
    assert_eq!(x.len(), out.len() * QK_K, "quantize_q8k: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if level != IsaLevel::Scalar {
        for (x, blk) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
            // SAFETY: every level above Scalar includes AVX2; `x` holds 256 elements.
            unsafe { avx2::quantize_q8k(x.as_ptr(), blk) };
        }
        return;
    }
    let _ = level;
    for (x, blk) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let (d, id) = scales(scalar::amax(x));
        for (q, &v) in blk.qs.iter_mut().zip(x) {
            *q = scalar::round(v, id);
        }
        for (s, q) in blk.bsums.iter_mut().zip(blk.qs.chunks_exact(16)) {
            *s = q.iter().map(|&v| v as i16).sum();
        }
        for (s, b) in blk.bsums32.iter_mut().zip(blk.bsums.chunks_exact(2)) {
            *s = b[0] + b[1];
        }
        blk.d = d;
    }
}

mod scalar {
    #[inline]
    pub fn amax(x: &[f32]) -> f32 {
        x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
    }

    #[inline]
    pub fn round(v: f32, id: f32) -> i8 {
        (v * id).round_ties_even() as i8
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use core::arch::x86_64::*;

    use super::{BlockQ8K, scales};

    /// Largest magnitude of the 32 elements at `x`, as a vector.
    ///
    /// # Safety
    /// `x` must be valid for reading 32 f32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn amax32(x: *const f32) -> __m256 {
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        // SAFETY: the caller guarantees 32 readable elements.
        let v = unsafe { [0, 8, 16, 24].map(|i| _mm256_and_ps(_mm256_loadu_ps(x.add(i)), abs)) };
        _mm256_max_ps(_mm256_max_ps(v[0], v[1]), _mm256_max_ps(v[2], v[3]))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn hmax(v: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn hsum_epi32(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<1>(s)))
    }

    /// The 32 elements at `x` times `id`, rounded half to even (the default rounding mode), as
    /// i32 in four vectors of eight consecutive elements.
    ///
    /// # Safety
    /// `x` must be valid for reading 32 f32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn round32(x: *const f32, id: f32) -> [__m256i; 4] {
        let idv = _mm256_set1_ps(id);
        // SAFETY: the caller guarantees 32 readable elements.
        unsafe {
            [0, 8, 16, 24]
                .map(|i| _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x.add(i)), idv)))
        }
    }

    /// The 32 values of `q` packed to bytes, in order, into `out`.
    ///
    /// # Safety
    /// `out` must be valid for writing 32 bytes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn store_bytes(q: [__m256i; 4], out: *mut i8) {
        // The packs work within 128-bit lanes, leaving groups of four in the order 0 2 4 6 1 3 5 7.
        let packed = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let ordered =
            _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        // SAFETY: the caller guarantees 32 writable bytes.
        unsafe { _mm256_storeu_si256(out.cast(), ordered) };
    }

    /// # Safety
    /// `x` must be valid for reading 32 f32.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn quantize_block(x: *const f32) -> ([i8; 32], f32, i32) {
        // SAFETY (both): the caller guarantees 32 readable elements.
        let (d, id) = scales(hmax(unsafe { amax32(x) }));
        let q = unsafe { round32(x, id) };
        let sum = hsum_epi32(_mm256_add_epi32(
            _mm256_add_epi32(q[0], q[1]),
            _mm256_add_epi32(q[2], q[3]),
        ));
        let mut qs = [0; 32];
        // SAFETY: `qs` holds 32 bytes.
        unsafe { store_bytes(q, qs.as_mut_ptr()) };
        (qs, d, sum)
    }

    /// # Safety
    /// `x` must be valid for reading 256 f32.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn quantize_q8k(x: *const f32, blk: &mut BlockQ8K) {
        let mut m = _mm256_setzero_ps();
        for i in (0..256).step_by(32) {
            // SAFETY: i + 32 <= 256 readable elements.
            m = _mm256_max_ps(m, unsafe { amax32(x.add(i)) });
        }
        let (d, id) = scales(hmax(m));
        for (i, sums) in blk.bsums.chunks_exact_mut(2).enumerate() {
            // SAFETY: 32 i + 32 <= 256 readable elements; `qs` holds 256 bytes.
            let q = unsafe { round32(x.add(32 * i), id) };
            sums[0] = hsum_epi32(_mm256_add_epi32(q[0], q[1])) as i16;
            sums[1] = hsum_epi32(_mm256_add_epi32(q[2], q[3])) as i16;
            blk.bsums32[i] = sums[0] + sums[1];
            unsafe { store_bytes(q, blk.qs.as_mut_ptr().add(32 * i)) };
        }
        blk.d = d;
    }
}
