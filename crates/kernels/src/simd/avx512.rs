//! AVX-512 F + BW + VL: 16 f32 lanes.

use core::arch::x86_64::*;

use vortex_kv::{KvDtype, KvElem};

use super::{FP8_RAW_FACTOR, prefetch_part, raw_factor, raw_fp8};

const LANES: usize = 16;
/// Query heads scored or accumulated together: their accumulators stay in registers.
const HEAD_BLOCK: usize = 4;

/// Lanes below `len` (all 16 when `len >= 16`).
#[inline]
fn lanes_below(len: usize) -> __mmask16 {
    if len >= LANES {
        !0
    } else {
        ((1u32 << len) - 1) as __mmask16
    }
}

/// Sixteen elements at `p` widened to f32.
///
/// # Safety
/// `p` must be valid for reading sixteen `T`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn load<T: KvElem>(p: *const T) -> __m512 {
    // SAFETY: the caller guarantees sixteen readable elements; T::DTYPE tells their layout.
    unsafe {
        match T::DTYPE {
            KvDtype::F32 => _mm512_loadu_ps(p.cast()),
            KvDtype::F16 => _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())),
            KvDtype::Bf16 => {
                let wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(wide))
            }
            KvDtype::Fp8 => fp8_to_f32(_mm_loadu_si128(p.cast())),
        }
    }
}

/// The lanes of `mask` from `p` widened to f32, the others zero.
///
/// # Safety
/// `p + i` must be valid for reading for every lane `i` set in `mask`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn load_masked<T: KvElem>(p: *const T, mask: __mmask16) -> __m512 {
    // SAFETY: masked-off lanes are not accessed; the caller vouches for the others.
    unsafe {
        match T::DTYPE {
            KvDtype::F32 => _mm512_maskz_loadu_ps(mask, p.cast()),
            KvDtype::F16 => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p.cast())),
            KvDtype::Bf16 => {
                let wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p.cast()));
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(wide))
            }
            KvDtype::Fp8 => fp8_to_f32(_mm_maskz_loadu_epi8(mask, p.cast())),
        }
    }
}

/// Sixteen e4m3 bytes to f32, as the AVX2 version (through f16, on 256-bit integer lanes).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn fp8_to_f32(b: __m128i) -> __m512 {
    let v = _mm512_mul_ps(fp8_to_f32_raw(b), _mm512_set1_ps(FP8_RAW_FACTOR));
    let nan = _mm_cmpeq_epi8_mask(
        _mm_or_si128(b, _mm_set1_epi8(0x80u8 as i8)),
        _mm_set1_epi8(-1),
    );
    _mm512_mask_mov_ps(v, nan, _mm512_set1_ps(f32::NAN))
}

/// Sixteen e4m3 bytes to f32 divided by [`FP8_RAW_FACTOR`], with the NaN byte read as 480.
/// The attention loops use it on pages [`raw_fp8`](super::raw_fp8) allows, folding the factor into their
/// scale and probabilities, which leaves their results bit for bit the same (see
/// [`FP8_RAW_FACTOR`]).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn fp8_to_f32_raw(b: __m128i) -> __m512 {
    // Sign-extended and shifted, the byte's sign lands in bits 15 and 14 and its magnitude
    // in bits 13..7; clearing bit 14 leaves an f16 of the value times 2^-8.
    let h = _mm256_and_si256(
        _mm256_slli_epi16::<7>(_mm256_cvtepi8_epi16(b)),
        _mm256_set1_epi16(0xbf80u16 as i16),
    );
    _mm512_cvtph_ps(h)
}

/// Sixteen elements at `p` widened as [`load`] does, except that with `RAW` fp8 comes from
/// [`fp8_to_f32_raw`].
///
/// # Safety
/// As [`load`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn widen<T: KvElem, const RAW: bool>(p: *const T) -> __m512 {
    // SAFETY: the caller guarantees sixteen readable elements.
    unsafe {
        match T::DTYPE {
            KvDtype::Fp8 if RAW => fp8_to_f32_raw(_mm_loadu_si128(p.cast())),
            _ => load(p),
        }
    }
}

/// The lanes of `mask` from `p`, as [`load_masked`] widens them, except that with `RAW` fp8
/// comes from [`fp8_to_f32_raw`].
///
/// # Safety
/// As [`load_masked`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn widen_masked<T: KvElem, const RAW: bool>(p: *const T, mask: __mmask16) -> __m512 {
    // SAFETY: masked-off lanes are not accessed; the caller vouches for the others.
    unsafe {
        match T::DTYPE {
            KvDtype::Fp8 if RAW => fp8_to_f32_raw(_mm_maskz_loadu_epi8(mask, p.cast())),
            _ => load_masked(p, mask),
        }
    }
}

/// Elements `i..` of `x` (at most 16) as [`widen_masked`] gives them, lanes past the end zero.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn widen_from<T: KvElem, const RAW: bool>(x: &[T], i: usize) -> __m512 {
    let mask = lanes_below(x.len().saturating_sub(i));
    // SAFETY: only lanes inside `x` are set in the mask.
    unsafe { widen_masked::<T, RAW>(x.as_ptr().wrapping_add(i), mask) }
}

/// Elements `i..` of `x` (at most 16) widened to f32, lanes past the end zero.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn load_from<T: KvElem>(x: &[T], i: usize) -> __m512 {
    let mask = lanes_below(x.len().saturating_sub(i));
    // SAFETY: only lanes inside `x` are set in the mask.
    unsafe { load_masked(x.as_ptr().wrapping_add(i), mask) }
}

/// Stores the lanes of `v` that fall inside `x[i..]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn store_to(x: &mut [f32], i: usize, v: __m512) {
    let mask = lanes_below(x.len().saturating_sub(i));
    // SAFETY: only lanes inside `x` are set in the mask.
    unsafe { _mm512_mask_storeu_ps(x.as_mut_ptr().wrapping_add(i), mask, v) }
}

/// Horizontal sums of four vectors, in order.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn reduce4(a: __m512, b: __m512, c: __m512, d: __m512) -> __m128 {
    // Per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3].
    let ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    let cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    // Per 128-bit lane: [a, b, c, d] partial sums.
    let (ab, cd) = (_mm512_castps_pd(ab), _mm512_castps_pd(cd));
    let abcd = _mm512_add_ps(
        _mm512_castpd_ps(_mm512_unpacklo_pd(ab, cd)),
        _mm512_castpd_ps(_mm512_unpackhi_pd(ab, cd)),
    );
    let lo = _mm512_castps512_ps256(abcd);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(abcd)));
    let s = _mm256_add_ps(lo, hi);
    _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s))
}

/// `exp(x)`, 0 below the smallest normal result (Cephes polynomial, ~1 ulp).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) fn exp(x: __m512) -> __m512 {
    // Unordered and with `x` second: a NaN passes through as NaN, as in the scalar exp.
    let normal = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, _mm512_set1_ps(-87.336_55));
    let x = _mm512_min_ps(_mm512_set1_ps(88.376_26), x);
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
    let mut y = _mm512_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ] {
        y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(c));
    }
    let y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r);
    let y = _mm512_add_ps(y, _mm512_set1_ps(1.0));
    _mm512_maskz_mov_ps(normal, _mm512_scalef_ps(y, n))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub fn dot<T: KvElem>(a: &[f32], b: &[T]) -> f32 {
    let n = a.len().min(b.len());
    let body = n - n % (2 * LANES);
    let (mut s0, mut s1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut i = 0;
    while i < body {
        // SAFETY: i + 32 <= n, within both slices.
        let (a0, b0, a1, b1) = unsafe {
            let (pa, pb) = (a.as_ptr().add(i), b.as_ptr().add(i));
            (
                _mm512_loadu_ps(pa),
                load(pb),
                _mm512_loadu_ps(pa.add(LANES)),
                load(pb.add(LANES)),
            )
        };
        s0 = _mm512_fmadd_ps(a0, b0, s0);
        s1 = _mm512_fmadd_ps(a1, b1, s1);
        i += 2 * LANES;
    }
    while i < n {
        s0 = _mm512_fmadd_ps(load_from(&a[..n], i), load_from(&b[..n], i), s0);
        i += LANES;
    }
    _mm512_reduce_add_ps(_mm512_add_ps(s0, s1))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub fn axpy<T: KvElem>(acc: &mut [f32], w: f32, x: &[T]) {
    let n = acc.len().min(x.len());
    let (acc, x) = (&mut acc[..n], &x[..n]);
    let wv = _mm512_set1_ps(w);
    let mut i = 0;
    while i < n {
        let v = _mm512_fmadd_ps(wv, load_from(x, i), load_from(acc, i));
        store_to(acc, i, v);
        i += LANES;
    }
}

/// `dst = x` widened to f32 (as many elements as the shorter holds).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub fn widen_into<T: KvElem>(dst: &mut [f32], x: &[T]) {
    let n = dst.len().min(x.len());
    let (dst, x) = (&mut dst[..n], &x[..n]);
    let mut i = 0;
    while i < n {
        store_to(dst, i, load_from(x, i));
        i += LANES;
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub fn sum(x: &[f32]) -> f32 {
    let body = x.len() - x.len() % (4 * LANES);
    let mut s = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    while i < body {
        for (j, sj) in s.iter_mut().enumerate() {
            // SAFETY: i + 64 <= x.len().
            *sj = _mm512_add_ps(*sj, unsafe {
                _mm512_loadu_ps(x.as_ptr().add(i + j * LANES))
            });
        }
        i += 4 * LANES;
    }
    while i < x.len() {
        s[0] = _mm512_add_ps(s[0], load_from(x, i));
        i += LANES;
    }
    let v = _mm512_add_ps(_mm512_add_ps(s[0], s[1]), _mm512_add_ps(s[2], s[3]));
    _mm512_reduce_add_ps(v)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub fn max(x: &[f32]) -> f32 {
    let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut i = 0;
    while i < x.len() {
        let mask = lanes_below(x.len() - i);
        // SAFETY: only lanes inside `x` are set in the mask.
        let v = unsafe { _mm512_mask_loadu_ps(m, mask, x.as_ptr().add(i)) };
        // The second operand wins where either is NaN: `m` never holds one, so NaN is skipped
        // wherever it sits, as the scalar fold skips it.
        m = _mm512_max_ps(v, m);
        i += LANES;
    }
    _mm512_reduce_max_ps(m)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub fn scale(x: &mut [f32], c: f32) {
    let cv = _mm512_set1_ps(c);
    let mut i = 0;
    while i < x.len() {
        let v = _mm512_mul_ps(load_from(x, i), cv);
        store_to(x, i, v);
        i += LANES;
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub fn exp_shifted(x: &mut [f32], shift: f32) -> f32 {
    let shift = _mm512_set1_ps(shift);
    let mut sum = _mm512_setzero_ps();
    let mut i = 0;
    while i < x.len() {
        let mask = lanes_below(x.len() - i);
        let e = _mm512_maskz_mov_ps(mask, exp(_mm512_sub_ps(load_from(x, i), shift)));
        store_to(x, i, e);
        sum = _mm512_add_ps(sum, e);
        i += LANES;
    }
    _mm512_reduce_add_ps(sum)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub fn group_scores<T: KvElem>(
    q: &[f32],
    keys: &[T],
    dim: usize,
    scale: f32,
    scores: &mut [f32],
    ahead: &[T],
) {
    if raw_fp8(keys) {
        heads_scores::<T, true>(q, keys, dim, scale, scores, ahead);
    } else {
        heads_scores::<T, false>(q, keys, dim, scale, scores, ahead);
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn heads_scores<T: KvElem, const RAW: bool>(
    q: &[f32],
    keys: &[T],
    dim: usize,
    scale: f32,
    scores: &mut [f32],
    ahead: &[T],
) {
    let scale = scale * raw_factor::<T, RAW>();
    let heads = q.len() / dim;
    let mut h = 0;
    while h < heads {
        let block = (heads - h).min(HEAD_BLOCK);
        let q = &q[h * dim..(h + block) * dim];
        // Later head blocks find the keys in cache; the first one fetches the next block.
        let ahead = if h == 0 { ahead } else { &[] };
        // Tiles of 16 (head, key) dot products, reduced together.
        match block {
            1 => scores_block::<1, 16, T, RAW>(q, keys, dim, scale, h, scores, ahead),
            2 => scores_block::<2, 8, T, RAW>(q, keys, dim, scale, h, scores, ahead),
            3 => scores_block::<3, 4, T, RAW>(q, keys, dim, scale, h, scores, ahead),
            _ => scores_block::<4, 4, T, RAW>(q, keys, dim, scale, h, scores, ahead),
        }
        h += block;
    }
}

/// Scores of the `HB` heads in `q` (from head `h0` on) against every key, `TB` keys at a
/// time (`HB * TB <= 16`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[allow(clippy::too_many_arguments)]
fn scores_block<const HB: usize, const TB: usize, T: KvElem, const RAW: bool>(
    q: &[f32],
    keys: &[T],
    dim: usize,
    scale: f32,
    h0: usize,
    scores: &mut [f32],
    ahead: &[T],
) {
    let tokens = keys.len() / dim;
    assert!(q.len() == HB * dim && scores.len() >= (h0 + HB) * tokens);
    let mut t = 0;
    while t + TB <= tokens {
        prefetch_part(ahead, t * dim, TB * dim);
        let tile = _mm512_mul_ps(
            tile_scores::<HB, TB, T, RAW>(q, &keys[t * dim..], dim),
            _mm512_set1_ps(scale),
        );
        let mut lanes = [0.0f32; LANES];
        // SAFETY: `lanes` holds sixteen f32.
        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), tile) };
        for j in 0..HB {
            scores[(h0 + j) * tokens + t..][..TB].copy_from_slice(&lanes[j * TB..][..TB]);
        }
        t += TB;
    }
    while t < tokens {
        prefetch_part(ahead, t * dim, dim);
        let sums = _mm_mul_ps(
            token_scores::<HB, T, RAW>(q, &keys[t * dim..], dim),
            _mm_set1_ps(scale),
        );
        let mut lanes = [0.0f32; 4];
        // SAFETY: `lanes` holds four f32.
        unsafe { _mm_storeu_ps(lanes.as_mut_ptr(), sums) };
        for (j, &s) in lanes.iter().take(HB).enumerate() {
            scores[(h0 + j) * tokens + t] = s;
        }
        t += 1;
    }
}

/// Dot products of the `HB` query rows of `q` with the first `TB` key rows of `keys`:
/// lane `j * TB + u` is `q[j] · keys[u]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn tile_scores<const HB: usize, const TB: usize, T: KvElem, const RAW: bool>(
    q: &[f32],
    keys: &[T],
    dim: usize,
) -> __m512 {
    assert!(HB * TB <= LANES && q.len() >= HB * dim && keys.len() >= TB * dim);
    let body = dim - dim % LANES;
    let mut acc = [_mm512_setzero_ps(); LANES];
    let mut i = 0;
    while i < body {
        let mut qv = [_mm512_setzero_ps(); HB];
        for (j, qv) in qv.iter_mut().enumerate() {
            // SAFETY: i + 16 <= dim, inside query row j.
            *qv = unsafe { _mm512_loadu_ps(q.as_ptr().add(j * dim + i)) };
        }
        for u in 0..TB {
            // SAFETY: i + 16 <= dim, inside key row u.
            let k = unsafe { widen::<T, RAW>(keys.as_ptr().add(u * dim + i)) };
            for (j, &qv) in qv.iter().enumerate() {
                acc[j * TB + u] = _mm512_fmadd_ps(qv, k, acc[j * TB + u]);
            }
        }
        i += LANES;
    }
    if i < dim {
        for j in 0..HB {
            let qv = load_from(&q[j * dim..(j + 1) * dim], i);
            for u in 0..TB {
                let k = widen_from::<T, RAW>(&keys[u * dim..(u + 1) * dim], i);
                acc[j * TB + u] = _mm512_fmadd_ps(qv, k, acc[j * TB + u]);
            }
        }
    }
    reduce16(acc)
}

/// Horizontal sums of sixteen vectors: lane `i` of the result sums vector `i`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) fn reduce16(v: [__m512; LANES]) -> __m512 {
    // Each 128-bit lane of pairs[m] holds partial sums of v[2m] and v[2m + 1], interleaved.
    let mut pairs = [_mm512_setzero_ps(); 8];
    for (m, p) in pairs.iter_mut().enumerate() {
        let (a, b) = (v[2 * m], v[2 * m + 1]);
        *p = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    }
    // Each 128-bit lane of quads[l] holds partial sums of v[4l..4l + 4], in order.
    let mut quads = [_mm512_setzero_ps(); 4];
    for (l, qd) in quads.iter_mut().enumerate() {
        let (a, b) = (
            _mm512_castps_pd(pairs[2 * l]),
            _mm512_castps_pd(pairs[2 * l + 1]),
        );
        *qd = _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)),
        );
    }
    // Sum the four 128-bit lanes of each quad, moving quad l to 128-bit lane l.
    let fold = |a: __m512, b: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
        )
    };
    fold(fold(quads[0], quads[1]), fold(quads[2], quads[3]))
}

/// Dot products of the `HB` query rows of `q` with the first key row of `keys`: lane `j`
/// is `q[j] · keys[0]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn token_scores<const HB: usize, T: KvElem, const RAW: bool>(
    q: &[f32],
    keys: &[T],
    dim: usize,
) -> __m128 {
    assert!(HB <= HEAD_BLOCK && q.len() >= HB * dim && keys.len() >= dim);
    let mut acc = [_mm512_setzero_ps(); HEAD_BLOCK];
    let mut i = 0;
    while i < dim {
        let k = widen_from::<T, RAW>(&keys[..dim], i);
        for (j, a) in acc.iter_mut().take(HB).enumerate() {
            *a = _mm512_fmadd_ps(load_from(&q[j * dim..(j + 1) * dim], i), k, *a);
        }
        i += LANES;
    }
    reduce4(acc[0], acc[1], acc[2], acc[3])
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub fn group_accumulate<T: KvElem>(
    probs: &[f32],
    values: &[T],
    dim: usize,
    acc: &mut [f32],
    ahead: &[T],
) {
    if raw_fp8(values) {
        heads_accumulate::<T, true>(probs, values, dim, acc, ahead);
    } else {
        heads_accumulate::<T, false>(probs, values, dim, acc, ahead);
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn heads_accumulate<T: KvElem, const RAW: bool>(
    probs: &[f32],
    values: &[T],
    dim: usize,
    acc: &mut [f32],
    ahead: &[T],
) {
    let heads = acc.len() / dim;
    let tokens = values.len() / dim;
    let mut h = 0;
    while h < heads {
        let block = (heads - h).min(HEAD_BLOCK);
        let probs = &probs[h * tokens..(h + block) * tokens];
        let acc = &mut acc[h * dim..(h + block) * dim];
        let ahead = if h == 0 { ahead } else { &[] };
        // Blocks of about 16 accumulators: few heads take more dims per pass.
        match block {
            1 => accumulate_block::<1, 8, T, RAW>(probs, values, dim, acc, ahead),
            2 => accumulate_block::<2, 8, T, RAW>(probs, values, dim, acc, ahead),
            3 => accumulate_block::<3, 4, T, RAW>(probs, values, dim, acc, ahead),
            _ => accumulate_block::<4, 4, T, RAW>(probs, values, dim, acc, ahead),
        }
        h += block;
    }
}

/// `acc[h] += sum_t probs[h][t] * values[t]` for `HB` heads, `CB * 16` dims at a time so
/// the accumulators stay in registers while the value rows stream by.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn accumulate_block<const HB: usize, const CB: usize, T: KvElem, const RAW: bool>(
    probs: &[f32],
    values: &[T],
    dim: usize,
    acc: &mut [f32],
    ahead: &[T],
) {
    let tokens = values.len() / dim;
    assert!(probs.len() == HB * tokens && acc.len() == HB * dim);
    let mut base = 0;
    while base < dim {
        let mut masks = [0 as __mmask16; CB];
        for (c, m) in masks.iter_mut().enumerate() {
            *m = lanes_below(dim.saturating_sub(base + c * LANES));
        }
        let mut sums = [[_mm512_setzero_ps(); CB]; HB];
        for (j, row) in sums.iter_mut().enumerate() {
            for (c, s) in row.iter_mut().enumerate() {
                *s = load_from(&acc[j * dim..(j + 1) * dim], base + c * LANES);
            }
        }
        for t in 0..tokens {
            if base == 0 {
                prefetch_part(ahead, t * dim, dim);
            }
            let value = values[t * dim..].as_ptr().wrapping_add(base);
            let mut v = [_mm512_setzero_ps(); CB];
            for (c, vc) in v.iter_mut().enumerate() {
                // SAFETY: masks[c] covers only lanes below dim in row t.
                *vc = unsafe { widen_masked::<T, RAW>(value.wrapping_add(c * LANES), masks[c]) };
            }
            for (j, row) in sums.iter_mut().enumerate() {
                // SAFETY: j < HB and t < tokens, inside `probs` (checked above).
                let p = unsafe { *probs.get_unchecked(j * tokens + t) };
                let p = _mm512_set1_ps(p * raw_factor::<T, RAW>());
                for (s, &vc) in row.iter_mut().zip(&v) {
                    *s = _mm512_fmadd_ps(p, vc, *s);
                }
            }
        }
        for (j, row) in sums.iter().enumerate() {
            for (c, &s) in row.iter().enumerate() {
                store_to(&mut acc[j * dim..(j + 1) * dim], base + c * LANES, s);
            }
        }
        base += CB * LANES;
    }
}
