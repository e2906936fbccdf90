//! AVX2 + FMA + F16C dot products of one weight row with `NT` activation rows (same contract as
//! [`super::dot_scalar`]). Each weight block is decoded once and multiplied with all `NT` rows.

use core::arch::x86_64::*;

use super::dot_scalar::{blocks, pairs};
use super::q8::{BlockQ8K, BlockQ8x2};

/// The two little-endian f16 at `p` and `p + 2`, widened.
///
/// # Safety
/// `p` must be valid for reading four bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_pair(p: *const u8) -> (f32, f32) {
    // SAFETY: the caller guarantees four readable bytes.
    let bits = unsafe { p.cast::<i32>().read_unaligned() };
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    hsum_ps128(s)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum_ps128(s: __m128) -> f32 {
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Byte `j` is 0x10 where bit `j` of `x` is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bit4_bytes(x: u32) -> __m256i {
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(x as i32),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    // Set every bit except bit `j % 8` of byte `j`; the byte is all ones iff that bit was set.
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    let set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi64x(-1));
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// Kinds of 32-element block, the `KIND` parameter of the `block32_kernels!` kernel.
pub(super) const Q4_0: u8 = 0;
pub(super) const Q4_1: u8 = 1;
pub(super) const Q5_0: u8 = 2;
pub(super) const Q8_0: u8 = 3;

/// Bytes per block of a 32-element block kind.
pub(super) const fn block32_bytes(kind: u8) -> usize {
    match kind {
        Q4_0 => 18,
        Q4_1 => 20,
        Q5_0 => 22,
        _ => 34,
    }
}

/// The values of the blocks of `KIND` at `p0` (A) and `p1` (B), laid out like [`BlockQ8x2`]:
/// `(A[0..16] B[0..16], A[16..32] B[16..32])`. Nibbles and Q8_0 bytes as stored; Q5_0 without
/// its high bits.
///
/// # Safety
/// `p0` and `p1` must be valid for reading a block of `KIND`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pair_values<const KIND: u8>(
    p0: *const u8,
    p1: *const u8,
) -> (__m256i, __m256i) {
    // SAFETY: the caller guarantees whole blocks.
    let load2 = |off: usize| unsafe {
        _mm256_set_m128i(
            _mm_loadu_si128(p1.add(off).cast()),
            _mm_loadu_si128(p0.add(off).cast()),
        )
    };
    if KIND == Q8_0 {
        return (load2(2), load2(18));
    }
    let v = load2(match KIND {
        Q4_0 => 2,
        Q4_1 => 4,
        _ => 6,
    });
    let m4 = _mm256_set1_epi8(0x0F);
    (
        _mm256_and_si256(v, m4),
        _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4),
    )
}

/// The high bits of the Q5_0 blocks at `p0` (A) and `p1` (B), for the `lo` and `hi` halves of
/// [`pair_values`]: bit `j` of each mask belongs to byte `j` of the half.
///
/// # Safety
/// `p0` and `p1` must be valid for reading a Q5_0 block.
#[inline]
pub(super) unsafe fn q5_0_high_masks(p0: *const u8, p1: *const u8) -> (u32, u32) {
    // SAFETY: the caller guarantees whole blocks; qh is bytes 2..6.
    let (a, b) = unsafe {
        (
            p0.add(2).cast::<u32>().read_unaligned(),
            p1.add(2).cast::<u32>().read_unaligned(),
        )
    };
    ((a & 0xFFFF) | (b << 16), (a >> 16) | (b & 0xFFFF_0000))
}

/// The scales of the blocks of `KIND` at `p0` and `p1`, widened: `([d0, d1, ..], [m0, m1, ..])`
/// (the minimums only for Q4_1).
///
/// Both blocks are converted by one instruction from a value assembled in a general register: a
/// lone 16-bit scale would be inserted into whatever vector register is at hand, chaining every
/// block to that register's last writer (often the loop's accumulator).
///
/// # Safety
/// `p0` and `p1` must be valid for reading a block of `KIND`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pair_scales<const KIND: u8>(p0: *const u8, p1: *const u8) -> (__m128, __m128) {
    // SAFETY: the caller guarantees whole blocks, of at least four bytes.
    unsafe {
        if KIND == Q4_1 {
            let lo = p0.cast::<u32>().read_unaligned() as u64;
            let hi = p1.cast::<u32>().read_unaligned() as u64;
            let v = _mm_cvtph_ps(_mm_cvtsi64_si128((lo | hi << 32) as i64));
            (
                _mm_shuffle_ps::<0b10_00_10_00>(v, v),
                _mm_shuffle_ps::<0b11_01_11_01>(v, v),
            )
        } else {
            let lo = p0.cast::<u16>().read_unaligned() as u32;
            let hi = p1.cast::<u16>().read_unaligned() as u32;
            let v = _mm_cvtph_ps(_mm_cvtsi32_si128((lo | hi << 16) as i32));
            (v, _mm_setzero_ps())
        }
    }
}

/// Sums of four consecutive products of unsigned `a` and signed `b` bytes, in eight i32 lanes.
/// Exact while pairs of products fit in i16 (`a <= 128`, or `a < 64` with any `b`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn mul_sum_u8i8(a: __m256i, b: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))
}

/// Sums of four consecutive products of signed bytes; `b` must not hold -128.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn mul_sum_i8(a: __m256i, b: __m256i) -> __m256i {
    mul_sum_u8i8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a))
}

/// Weight values of a pair, ready for [`pair_dot`].
///
/// # Safety
/// `p0` and `p1` must be valid for reading a block of `KIND`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pair_weights<const KIND: u8>(p0: *const u8, p1: *const u8) -> (__m256i, __m256i) {
    // SAFETY: the caller guarantees whole blocks.
    let (lo, hi) = unsafe { pair_values::<KIND>(p0, p1) };
    if KIND != Q5_0 {
        return (lo, hi);
    }
    // SAFETY: as above.
    let (mlo, mhi) = unsafe { q5_0_high_masks(p0, p1) };
    (
        _mm256_or_si256(lo, bit4_bytes(mlo)),
        _mm256_or_si256(hi, bit4_bytes(mhi)),
    )
}

/// `Σ (q - offset) y` of two weight blocks (from [`pair_weights`]) with an activation pair
/// ([`pair_acts`]): block A in lanes 0..4, B in lanes 4..8. The unsigned formats are multiplied
/// as stored and their offsets applied through the activation sums; Q8_0 multiplies signed bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pair_dot<const KIND: u8>(lo: __m256i, hi: __m256i, y: &PairActs) -> __m256i {
    if KIND == Q8_0 {
        return _mm256_add_epi32(mul_sum_i8(lo, y.lo), mul_sum_i8(hi, y.hi));
    }
    // Values below 32: two products per half and two halves stay within i16.
    let p16 = _mm256_add_epi16(
        _mm256_maddubs_epi16(lo, y.lo),
        _mm256_maddubs_epi16(hi, y.hi),
    );
    let p = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
    match KIND {
        Q4_0 => _mm256_add_epi32(p, y.bias),
        Q5_0 => _mm256_add_epi32(p, _mm256_slli_epi32::<1>(y.bias)),
        _ => p,
    }
}

/// An activation pair in registers.
#[derive(Clone, Copy)]
pub(super) struct PairActs {
    pub lo: __m256i,
    pub hi: __m256i,
    pub bias: __m256i,
    /// `[dA, dB, ..]`.
    pub d: __m128,
    /// `[sA, sB, ..]`.
    pub s: __m128,
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn pair_acts(y: &BlockQ8x2) -> PairActs {
    // SAFETY: the arrays of a `BlockQ8x2` (32-byte aligned) hold 32, 32, 32, 8 and 8 bytes.
    unsafe {
        PairActs {
            lo: _mm256_load_si256(y.lo.as_ptr().cast()),
            hi: _mm256_load_si256(y.hi.as_ptr().cast()),
            bias: _mm256_load_si256(y.bias.as_ptr().cast()),
            d: _mm_castsi128_ps(_mm_loadl_epi64(y.d.as_ptr().cast())),
            s: _mm_castsi128_ps(_mm_loadl_epi64(y.s.as_ptr().cast())),
        }
    }
}

/// A weight pair in registers: values (from `pair_weights`) and scales.
#[derive(Clone, Copy)]
pub(super) struct PairWeights {
    pub lo: __m256i,
    pub hi: __m256i,
    /// `[dA, dB, ..]`.
    pub d: __m128,
    /// `[mA, mB, ..]` (Q4_1).
    pub m: __m128,
}

/// The 32-element formats, instantiated here with AVX2 multiply-adds and in
/// [`super::dot_avx512`] with VNNI. The expansion site provides `pair_weights` and `pair_dot`;
/// `pair_scales`, `pair_acts`, `hsum_ps`, `hsum_ps128` and `pairs` must be in scope.
///
/// Weight blocks go two at a time, against one [`BlockQ8x2`] per token. Per two pairs the
/// products are summed before the loop-carried add, which keeps the dependency chain at one add
/// per four blocks for small `NT`.
macro_rules! block32_kernels {
    ($features:literal) => {
        /// Blocks `b0` and `b1` of a row of `KIND` blocks as a weight pair.
        ///
        /// # Safety
        /// Both blocks must lie within `w`.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn weight_pair<const KIND: u8>(w: &[u8], b0: usize, b1: usize) -> PairWeights {
            let bytes = block32_bytes(KIND);
            // SAFETY: the caller guarantees both blocks.
            unsafe {
                let (p0, p1) = (w.as_ptr().add(b0 * bytes), w.as_ptr().add(b1 * bytes));
                let ((lo, hi), (d, m)) =
                    (pair_weights::<KIND>(p0, p1), pair_scales::<KIND>(p0, p1));
                PairWeights { lo, hi, d, m }
            }
        }

        /// The products of a weight pair with an activation pair, and each lane's scale: block A's
        /// `d * dy` in lanes 0..4, B's in 4..8.
        #[inline]
        #[target_feature(enable = $features)]
        fn pair_products<const KIND: u8>(w: &PairWeights, y: &PairActs) -> (__m256, __m256) {
            let spread = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
            let scale =
                _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_mul_ps(w.d, y.d)), spread);
            (scale, _mm256_cvtepi32_ps(pair_dot::<KIND>(w.lo, w.hi, y)))
        }

        /// `Σ_b d_b dy_b Σ (q - offset) y (+ m_b s_b for Q4_1)` over a row of `KIND` blocks.
        #[inline]
        #[target_feature(enable = $features)]
        fn dot_block32<const NT: usize, const KIND: u8>(
            w: &[u8],
            ys: [&[BlockQ8x2]; NT],
        ) -> [f32; NT] {
            let nb = pairs(w, block32_bytes(KIND), &ys);
            let np = nb.div_ceil(2);
            let mut acc = [_mm256_setzero_ps(); NT];
            let mut acc_m = [_mm_setzero_ps(); NT];
            let mut k = 0;
            while 2 * k + 4 <= nb {
                // SAFETY: blocks 2 k .. 2 k + 4 lie within the row, and pairs k, k + 1 < np.
                let (w0, w1) = unsafe {
                    (
                        weight_pair::<KIND>(w, 2 * k, 2 * k + 1),
                        weight_pair::<KIND>(w, 2 * k + 2, 2 * k + 3),
                    )
                };
                for ((a, am), y) in acc.iter_mut().zip(&mut acc_m).zip(&ys) {
                    // SAFETY: k + 1 < np = y.len().
                    let (y0, y1) = unsafe {
                        (
                            pair_acts(y.get_unchecked(k)),
                            pair_acts(y.get_unchecked(k + 1)),
                        )
                    };
                    let (s0, p0) = pair_products::<KIND>(&w0, &y0);
                    let (s1, p1) = pair_products::<KIND>(&w1, &y1);
                    *a = _mm256_add_ps(*a, _mm256_fmadd_ps(s1, p1, _mm256_mul_ps(s0, p0)));
                    if KIND == Q4_1 {
                        *am = _mm_add_ps(*am, _mm_fmadd_ps(w1.m, y1.s, _mm_mul_ps(w0.m, y0.s)));
                    }
                }
                k += 2;
            }
            while k < np {
                // A last pair or two, or a last lone block paired with itself (its activation
                // half B is all zero). SAFETY: both blocks are below nb.
                let w0 = unsafe { weight_pair::<KIND>(w, 2 * k, (2 * k + 1).min(nb - 1)) };
                for ((a, am), y) in acc.iter_mut().zip(&mut acc_m).zip(&ys) {
                    // SAFETY: k < np = y.len().
                    let y0 = pair_acts(unsafe { y.get_unchecked(k) });
                    let (s0, p0) = pair_products::<KIND>(&w0, &y0);
                    *a = _mm256_fmadd_ps(s0, p0, *a);
                    if KIND == Q4_1 {
                        *am = _mm_fmadd_ps(w0.m, y0.s, *am);
                    }
                }
                k += 1;
            }
            let mut out = [0.0; NT];
            for ((o, a), am) in out.iter_mut().zip(acc).zip(acc_m) {
                *o = hsum_ps(a) + if KIND == Q4_1 { hsum_ps128(am) } else { 0.0 };
            }
            out
        }

        #[target_feature(enable = $features)]
        pub fn dot_q4_0<const NT: usize>(w: &[u8], ys: [&[BlockQ8x2]; NT]) -> [f32; NT] {
            dot_block32::<NT, Q4_0>(w, ys)
        }

        #[target_feature(enable = $features)]
        pub fn dot_q4_1<const NT: usize>(w: &[u8], ys: [&[BlockQ8x2]; NT]) -> [f32; NT] {
            dot_block32::<NT, Q4_1>(w, ys)
        }

        #[target_feature(enable = $features)]
        pub fn dot_q5_0<const NT: usize>(w: &[u8], ys: [&[BlockQ8x2]; NT]) -> [f32; NT] {
            dot_block32::<NT, Q5_0>(w, ys)
        }

        #[target_feature(enable = $features)]
        pub fn dot_q8_0<const NT: usize>(w: &[u8], ys: [&[BlockQ8x2]; NT]) -> [f32; NT] {
            dot_block32::<NT, Q8_0>(w, ys)
        }
    };
}

pub(super) use block32_kernels;

block32_kernels!("avx2,fma,f16c");

/// Scales (low half) and mins (high half) of the eight Q4_K sub-blocks as 16 i16, unpacked from
/// the 12 bytes at `p`.
///
/// # Safety
/// `p` must be valid for reading 12 bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_k_scales_mins(p: *const u8) -> __m256i {
    const K1: u32 = 0x3f3f_3f3f;
    const K2: u32 = 0x0f0f_0f0f;
    const K3: u32 = 0x0303_0303;
    // SAFETY: the caller guarantees 12 readable bytes.
    let u = unsafe { [0, 1, 2].map(|i| p.add(4 * i).cast::<u32>().read_unaligned()) };
    let scales_lo = u[0] & K1;
    let scales_hi = (u[2] & K2) | (((u[0] >> 6) & K3) << 4);
    let mins_lo = u[1] & K1;
    let mins_hi = ((u[2] >> 4) & K2) | (((u[1] >> 6) & K3) << 4);
    _mm256_cvtepu8_epi16(_mm_set_epi32(
        mins_hi as i32,
        mins_lo as i32,
        scales_hi as i32,
        scales_lo as i32,
    ))
}

/// i16 lane `k` of each 128-bit half of `v`, broadcast over the vector.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn broadcast_i16(v: __m256i, k: usize) -> __m256i {
    let lo = (2 * k) as i16;
    _mm256_shuffle_epi8(v, _mm256_set1_epi16(lo | ((lo + 1) << 8)))
}

/// `acc` plus the sums of adjacent products of i16 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn madd_acc(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
}

/// The K-quant formats, instantiated here with AVX2 multiply-adds and in [`super::dot_avx512`]
/// with VNNI. The expansion site provides `madd_acc`; `f16_pair`, `q4_k_scales_mins`,
/// `broadcast_i16`, `hsum_ps`, `hsum_ps128` and `blocks` must be in scope.
///
/// Each super-block's integer sums go to two accumulators per token, which halves their
/// dependency chains.
macro_rules! k_quant_kernels {
    ($features:literal) => {
        /// `Σ_b d dy Σ_s scale_s Σ q y - dmin dy Σ_s min_s Σ y` over super-blocks of eight
        /// sub-blocks of 32; 32 bytes of `qs` hold two sub-blocks (low nibbles, then high).
        #[target_feature(enable = $features)]
        pub fn dot_q4_k<const NT: usize>(w: &[u8], ys: [&[BlockQ8K]; NT]) -> [f32; NT] {
            let nb = blocks(w, 144, &ys);
            let m4 = _mm256_set1_epi8(0x0F);
            let mut acc = [_mm256_setzero_ps(); NT];
            let mut acc_min = [_mm_setzero_ps(); NT];
            for b in 0..nb {
                // SAFETY: block b lies within `w`.
                let p = unsafe { w.as_ptr().add(b * 144) };
                // SAFETY: as above; d and dmin are bytes 0..4 of the block, scales and mins 4..16.
                let ((d, dmin), sm) = unsafe { (f16_pair(p), q4_k_scales_mins(p.add(4))) };
                let scales = _mm256_permute4x64_epi64::<0x44>(sm);
                let mins = _mm256_extracti128_si256::<1>(sm);
                // SAFETY: b < nb = y.len().
                let yb: [&BlockQ8K; NT] =
                    std::array::from_fn(|t| unsafe { ys[t].get_unchecked(b) });
                let mut sumi = [[_mm256_setzero_si256(); 2]; NT];
                for j in 0..4 {
                    // SAFETY: bytes 16 + 32 j .. 48 + 32 j of the block.
                    let bits = unsafe { _mm256_loadu_si256(p.add(16 + 32 * j).cast()) };
                    let lo = _mm256_and_si256(bits, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
                    let sc_lo = broadcast_i16(scales, 2 * j);
                    let sc_hi = broadcast_i16(scales, 2 * j + 1);
                    for ([s0, s1], y) in sumi.iter_mut().zip(&yb) {
                        let qy = y.qs.as_ptr();
                        // SAFETY: `qs` holds 256 bytes; 64 j + 64 <= 256.
                        let (y_lo, y_hi) = unsafe {
                            (
                                _mm256_loadu_si256(qy.add(64 * j).cast()),
                                _mm256_loadu_si256(qy.add(64 * j + 32).cast()),
                            )
                        };
                        *s0 = madd_acc(*s0, _mm256_maddubs_epi16(lo, y_lo), sc_lo);
                        *s1 = madd_acc(*s1, _mm256_maddubs_epi16(hi, y_hi), sc_hi);
                    }
                }
                for ((a, am), ([s0, s1], y)) in
                    acc.iter_mut().zip(&mut acc_min).zip(sumi.iter().zip(&yb))
                {
                    // SAFETY: `bsums` holds 16 i16.
                    let bs = unsafe { _mm256_loadu_si256(y.bsums.as_ptr().cast()) };
                    let sums32 = _mm_hadd_epi16(
                        _mm256_castsi256_si128(bs),
                        _mm256_extracti128_si256::<1>(bs),
                    );
                    let pm = _mm_cvtepi32_ps(_mm_madd_epi16(mins, sums32));
                    *am = _mm_fmadd_ps(_mm_set1_ps(dmin * y.d), pm, *am);
                    let s = _mm256_cvtepi32_ps(_mm256_add_epi32(*s0, *s1));
                    *a = _mm256_fmadd_ps(_mm256_set1_ps(d * y.d), s, *a);
                }
            }
            let mut out = [0.0; NT];
            for ((o, a), am) in out.iter_mut().zip(acc).zip(acc_min) {
                *o = hsum_ps(a) - hsum_ps128(am);
            }
            out
        }

        /// `Σ_b d dy Σ_s scale_s Σ (q - 32) y` over super-blocks of sixteen sub-blocks of 16;
        /// the `-32` is applied once per super-block through the activation sums `bsums`.
        #[target_feature(enable = $features)]
        pub fn dot_q6_k<const NT: usize>(w: &[u8], ys: [&[BlockQ8K]; NT]) -> [f32; NT] {
            let nb = blocks(w, 210, &ys);
            let m4 = _mm256_set1_epi8(0x0F);
            let m2 = _mm256_set1_epi8(0x30);
            let mut acc = [_mm256_setzero_ps(); NT];
            for b in 0..nb {
                // SAFETY: block b lies within `w`.
                let p = unsafe { w.as_ptr().add(b * 210) };
                // SAFETY: the 16 scales are bytes 192..208, d bytes 208..210 (read with the last
                // scales).
                let (sc8, d) =
                    unsafe { (_mm_loadu_si128(p.add(192).cast()), f16_pair(p.add(206)).1) };
                let sc16 = _mm256_cvtepi8_epi16(sc8);
                // Scales for the 32 values q[32 k..32 k + 32]: sub-blocks 2 k (low half), 2 k + 1.
                let pair = |k: i64| {
                    let idx = _mm_set_epi64x(
                        (2 * k + 1) * 0x0101_0101_0101_0101,
                        2 * k * 0x0101_0101_0101_0101,
                    );
                    _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, idx))
                };
                // SAFETY: b < nb = y.len().
                let yb: [&BlockQ8K; NT] =
                    std::array::from_fn(|t| unsafe { ys[t].get_unchecked(b) });
                let mut sumi = [[_mm256_setzero_si256(); 2]; NT];
                for ([s0, _], y) in sumi.iter_mut().zip(&yb) {
                    // SAFETY: `bsums` holds 16 i16.
                    let bs = unsafe { _mm256_loadu_si256(y.bsums.as_ptr().cast()) };
                    *s0 =
                        _mm256_sub_epi32(*s0, _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, bs)));
                }
                for half in 0..2 {
                    // SAFETY: ql (bytes 0..128) and qh (bytes 128..192) of the block.
                    let (ql0, ql1, qh) = unsafe {
                        (
                            _mm256_loadu_si256(p.add(64 * half).cast()),
                            _mm256_loadu_si256(p.add(64 * half + 32).cast()),
                            _mm256_loadu_si256(p.add(128 + 32 * half).cast()),
                        )
                    };
                    let q = [
                        _mm256_or_si256(
                            _mm256_and_si256(ql0, m4),
                            _mm256_and_si256(_mm256_slli_epi16::<4>(qh), m2),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(ql1, m4),
                            _mm256_and_si256(_mm256_slli_epi16::<2>(qh), m2),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                            _mm256_and_si256(qh, m2),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                            _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m2),
                        ),
                    ];
                    let base = 4 * half as i64;
                    let sc = [pair(base), pair(base + 1), pair(base + 2), pair(base + 3)];
                    for (s, y) in sumi.iter_mut().zip(&yb) {
                        let qy = y.qs.as_ptr();
                        for (k, (q, sc)) in q.iter().zip(&sc).enumerate() {
                            // SAFETY: 128 half + 32 k + 32 <= 256 bytes of `qs`.
                            let yv =
                                unsafe { _mm256_loadu_si256(qy.add(128 * half + 32 * k).cast()) };
                            s[k % 2] = madd_acc(s[k % 2], _mm256_maddubs_epi16(*q, yv), *sc);
                        }
                    }
                }
                for ((a, [s0, s1]), y) in acc.iter_mut().zip(sumi).zip(&yb) {
                    let s = _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1));
                    *a = _mm256_fmadd_ps(_mm256_set1_ps(d * y.d), s, *a);
                }
            }
            let mut out = [0.0; NT];
            for (o, a) in out.iter_mut().zip(acc) {
                *o = hsum_ps(a);
            }
            out
        }
    };
}

pub(super) use k_quant_kernels;

k_quant_kernels!("avx2,fma,f16c");

/// Storage of float weights.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum FloatKind {
    F32,
    F16,
    Bf16,
}

impl FloatKind {
    pub(super) fn bytes(self) -> usize {
        match self {
            FloatKind::F32 => 4,
            FloatKind::F16 | FloatKind::Bf16 => 2,
        }
    }
}

/// Eight weights at `p`, widened to f32.
///
/// # Safety
/// `p` must be valid for reading eight elements of `kind`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8(kind: FloatKind, p: *const u8) -> __m256 {
    // SAFETY: the caller guarantees eight readable elements.
    unsafe {
        match kind {
            FloatKind::F32 => _mm256_loadu_ps(p.cast()),
            FloatKind::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
            FloatKind::Bf16 => {
                let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(wide))
            }
        }
    }
}

/// Dot products of a row of float weights with `NT` f32 rows.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_float<const NT: usize>(kind: FloatKind, w: &[u8], xs: [&[f32]; NT]) -> [f32; NT] {
    // Four accumulators a token (enough to cover the FMA latency alone), whatever NT: a token's
    // sum then rounds the same however many tokens share the call, so a sequence's logits do
    // not depend on its batch. At most two tokens a pass over the row keep the accumulators in
    // the 16 registers.
    let mut out = [0.0; NT];
    for (o, xs) in out.chunks_mut(2).zip(xs.chunks(2)) {
        match *xs {
            [a, b] => o.copy_from_slice(&dot_float_unrolled::<2, 4>(kind, w, [a, b])),
            [a] => o[0] = dot_float_unrolled::<1, 4>(kind, w, [a])[0],
            _ => unreachable!("chunks of one or two"),
        }
    }
    out
}

/// [`dot_float`] with `U` accumulators per token.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_float_unrolled<const NT: usize, const U: usize>(
    kind: FloatKind,
    w: &[u8],
    xs: [&[f32]; NT],
) -> [f32; NT] {
    let eb = kind.bytes();
    let n = blocks(w, eb, &xs);
    let mut acc = [[_mm256_setzero_ps(); NT]; U];
    let mut i = 0;
    while i + 8 * U <= n {
        for (u, acc) in acc.iter_mut().enumerate() {
            let j = i + 8 * u;
            // SAFETY: j + 8 <= n elements of `w`.
            let wv = unsafe { load8(kind, w.as_ptr().add(j * eb)) };
            for (a, x) in acc.iter_mut().zip(&xs) {
                // SAFETY: j + 8 <= n = x.len().
                *a = _mm256_fmadd_ps(wv, unsafe { _mm256_loadu_ps(x.as_ptr().add(j)) }, *a);
            }
        }
        i += 8 * U;
    }
    while i + 8 <= n {
        // SAFETY: i + 8 <= n, as above.
        let wv = unsafe { load8(kind, w.as_ptr().add(i * eb)) };
        for (a, x) in acc[0].iter_mut().zip(&xs) {
            // SAFETY: i + 8 <= n = x.len().
            *a = _mm256_fmadd_ps(wv, unsafe { _mm256_loadu_ps(x.as_ptr().add(i)) }, *a);
        }
        i += 8;
    }
    let mut out = [0.0; NT];
    for (t, (o, x)) in out.iter_mut().zip(&xs).enumerate() {
        let mut sum = acc[0][t];
        for a in &acc[1..] {
            sum = _mm256_add_ps(sum, a[t]);
        }
        *o = hsum_ps(sum);
        for (j, &xj) in x.iter().enumerate().skip(i) {
            // SAFETY: j < n elements of `w`.
            *o += unsafe { scalar_at(kind, w.as_ptr().add(j * eb)) } * xj;
        }
    }
    out
}

/// # Safety
/// `p` must be valid for reading one element of `kind`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scalar_at(kind: FloatKind, p: *const u8) -> f32 {
    // SAFETY: the caller guarantees one readable element.
    unsafe {
        match kind {
            FloatKind::F32 => p.cast::<f32>().read_unaligned(),
            FloatKind::F16 => half::f16::from_bits(p.cast::<u16>().read_unaligned()).to_f32(),
            FloatKind::Bf16 => f32::from_bits((p.cast::<u16>().read_unaligned() as u32) << 16),
        }
    }
}
