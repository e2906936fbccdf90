//! AVX2 + FMA + F16C: 8 f32 lanes.

use core::arch::x86_64::*;

use vortex_kv::{KvDtype, KvElem};

use super::{FP8_RAW_FACTOR, prefetch_part, raw_factor, raw_fp8};

const LANES: usize = 8;
/// Query heads scored or accumulated together: their accumulators stay in registers.
const HEAD_BLOCK: usize = 4;

/// Eight elements at `p` widened to f32.
///
/// # Safety
/// `p` must be valid for reading eight `T`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load<T: KvElem>(p: *const T) -> __m256 {
    // SAFETY: the caller guarantees eight readable elements; T::DTYPE tells their layout.
    unsafe {
        match T::DTYPE {
            KvDtype::F32 => _mm256_loadu_ps(p.cast()),
            KvDtype::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
            KvDtype::Bf16 => {
                let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(wide))
            }
            KvDtype::Fp8 => fp8_to_f32(_mm_loadl_epi64(p.cast())),
        }
    }
}

/// The eight e4m3 bytes in the low half of `b` to f32, the NaN byte as NaN.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn fp8_to_f32(b: __m128i) -> __m256 {
    let v = _mm256_mul_ps(fp8_to_f32_raw(b), _mm256_set1_ps(FP8_RAW_FACTOR));
    let nan = _mm_cmpeq_epi8(
        _mm_or_si128(b, _mm_set1_epi8(0x80u8 as i8)),
        _mm_set1_epi8(-1),
    );
    let nan = _mm256_castsi256_ps(_mm256_cvtepi8_epi32(nan));
    _mm256_blendv_ps(v, _mm256_set1_ps(f32::NAN), nan)
}

/// The eight e4m3 bytes in the low half of `b` to f32 divided by [`FP8_RAW_FACTOR`], with the
/// NaN byte read as 480. The magnitude bits moved into an f16's exponent and mantissa give the
/// value times 2^-8 (an f16 subnormal when e = 0, which the f16 conversion reads exactly). The
/// attention loops use it on pages [`raw_fp8`](super::raw_fp8) allows, folding the factor into their
/// scale and probabilities, which leaves their results bit for bit the same (see
/// [`FP8_RAW_FACTOR`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn fp8_to_f32_raw(b: __m128i) -> __m256 {
    // Sign-extended and shifted, the byte's sign lands in bits 15 and 14 and its magnitude in
    // bits 13..7; clearing bit 14 leaves the f16.
    let h = _mm_and_si128(
        _mm_slli_epi16::<7>(_mm_cvtepi8_epi16(b)),
        _mm_set1_epi16(0xbf80u16 as i16),
    );
    _mm256_cvtph_ps(h)
}

/// Eight elements at `p` widened as [`load`] does, except that with `RAW` fp8 comes from
/// [`fp8_to_f32_raw`].
///
/// # Safety
/// As [`load`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen<T: KvElem, const RAW: bool>(p: *const T) -> __m256 {
    // SAFETY: the caller guarantees eight readable elements.
    unsafe {
        match T::DTYPE {
            KvDtype::Fp8 if RAW => fp8_to_f32_raw(_mm_loadl_epi64(p.cast())),
            _ => load(p),
        }
    }
}

/// One element as [`widen`] gives it.
#[inline]
fn widen_one<T: KvElem, const RAW: bool>(x: T) -> f32 {
    if RAW && T::DTYPE == KvDtype::Fp8 {
        x.to_f32() / FP8_RAW_FACTOR
    } else {
        x.to_f32()
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn reduce(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot<T: KvElem>(a: &[f32], b: &[T]) -> f32 {
    let n = a.len().min(b.len());
    let body = n - n % LANES;
    let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    while i + 2 * LANES <= body {
        // SAFETY: i + 16 <= n, within both slices.
        let (a0, b0, a1, b1) = unsafe {
            let (pa, pb) = (a.as_ptr().add(i), b.as_ptr().add(i));
            (
                _mm256_loadu_ps(pa),
                load(pb),
                _mm256_loadu_ps(pa.add(LANES)),
                load(pb.add(LANES)),
            )
        };
        s0 = _mm256_fmadd_ps(a0, b0, s0);
        s1 = _mm256_fmadd_ps(a1, b1, s1);
        i += 2 * LANES;
    }
    if i < body {
        // SAFETY: i + 8 <= n.
        let (a0, b0) = unsafe { (_mm256_loadu_ps(a.as_ptr().add(i)), load(b.as_ptr().add(i))) };
        s0 = _mm256_fmadd_ps(a0, b0, s0);
    }
    let tail: f32 = a[body..n]
        .iter()
        .zip(&b[body..n])
        .map(|(x, y)| x * y.to_f32())
        .sum();
    reduce(_mm256_add_ps(s0, s1)) + tail
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn axpy<T: KvElem>(acc: &mut [f32], w: f32, x: &[T]) {
    let n = acc.len().min(x.len());
    let body = n - n % LANES;
    let wv = _mm256_set1_ps(w);
    let mut i = 0;
    while i < body {
        // SAFETY: i + 8 <= n, within both slices.
        unsafe {
            let pa = acc.as_mut_ptr().add(i);
            let v = _mm256_fmadd_ps(wv, load(x.as_ptr().add(i)), _mm256_loadu_ps(pa));
            _mm256_storeu_ps(pa, v);
        }
        i += LANES;
    }
    for (a, v) in acc[body..n].iter_mut().zip(&x[body..n]) {
        *a += w * v.to_f32();
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn sum(x: &[f32]) -> f32 {
    let body = x.len() - x.len() % (4 * LANES);
    let mut s = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i < body {
        for (j, sj) in s.iter_mut().enumerate() {
            // SAFETY: i + 32 <= x.len().
            *sj = _mm256_add_ps(*sj, unsafe {
                _mm256_loadu_ps(x.as_ptr().add(i + j * LANES))
            });
        }
        i += 4 * LANES;
    }
    let v = _mm256_add_ps(_mm256_add_ps(s[0], s[1]), _mm256_add_ps(s[2], s[3]));
    reduce(v) + x[body..].iter().sum::<f32>()
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn max(x: &[f32]) -> f32 {
    let body = x.len() - x.len() % LANES;
    let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut i = 0;
    while i < body {
        // SAFETY: i + 8 <= x.len().
        // The second operand wins where either is NaN: `m` never holds one, so NaN is skipped
        // wherever it sits, as the scalar fold skips it.
        m = _mm256_max_ps(unsafe { _mm256_loadu_ps(x.as_ptr().add(i)) }, m);
        i += LANES;
    }
    let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    let h = _mm_max_ss(h, _mm_movehdup_ps(h));
    x[body..].iter().copied().fold(_mm_cvtss_f32(h), f32::max)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn scale(x: &mut [f32], c: f32) {
    let body = x.len() - x.len() % LANES;
    let cv = _mm256_set1_ps(c);
    let mut i = 0;
    while i < body {
        // SAFETY: i + 8 <= x.len().
        unsafe {
            let p = x.as_mut_ptr().add(i);
            _mm256_storeu_ps(p, _mm256_mul_ps(_mm256_loadu_ps(p), cv));
        }
        i += LANES;
    }
    x[body..].iter_mut().for_each(|v| *v *= c);
}

/// `exp(x)`, 0 below the smallest normal result (the AVX-512 version's polynomial, ~1 ulp).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn exp(x: __m256) -> __m256 {
    // Unordered and with `x` second: a NaN passes through as NaN, as in the scalar exp.
    let normal = _mm256_cmp_ps::<_CMP_NLT_UQ>(x, _mm256_set1_ps(-87.336_55));
    let x = _mm256_min_ps(_mm256_set1_ps(88.376_26), x);
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut y = _mm256_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ] {
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
    }
    let y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r);
    let y = _mm256_add_ps(y, _mm256_set1_ps(1.0));
    // 2^n in two factors, each a normal float for every n in [-126, 128].
    let n = _mm256_cvtps_epi32(n);
    let half = _mm256_srai_epi32::<1>(n);
    let pow2 = |e: __m256i| {
        _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            e,
            _mm256_set1_epi32(127),
        )))
    };
    let e = _mm256_mul_ps(
        _mm256_mul_ps(y, pow2(half)),
        pow2(_mm256_sub_epi32(n, half)),
    );
    _mm256_and_ps(e, normal)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn exp_shifted(x: &mut [f32], shift: f32) -> f32 {
    let body = x.len() - x.len() % LANES;
    let sv = _mm256_set1_ps(shift);
    let mut sum = _mm256_setzero_ps();
    let mut i = 0;
    while i < body {
        // SAFETY: i + 8 <= x.len().
        unsafe {
            let p = x.as_mut_ptr().add(i);
            let e = exp(_mm256_sub_ps(_mm256_loadu_ps(p), sv));
            _mm256_storeu_ps(p, e);
            sum = _mm256_add_ps(sum, e);
        }
        i += LANES;
    }
    let mut tail = [0.0f32; LANES];
    let rest = x.len() - body;
    tail[..rest].copy_from_slice(&x[body..]);
    // SAFETY: `tail` holds eight f32; lanes past `rest` are masked off below.
    let e = exp(_mm256_sub_ps(unsafe { _mm256_loadu_ps(tail.as_ptr()) }, sv));
    let keep = _mm256_cmpgt_epi32(
        _mm256_set1_epi32(rest as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    );
    let e = _mm256_and_ps(e, _mm256_castsi256_ps(keep));
    // SAFETY: as above.
    unsafe { _mm256_storeu_ps(tail.as_mut_ptr(), e) };
    x[body..].copy_from_slice(&tail[..rest]);
    reduce(_mm256_add_ps(sum, e))
}

#[target_feature(enable = "avx2,fma,f16c")]
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
#[target_feature(enable = "avx2,fma,f16c")]
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
        // Tiles of 8 (head, key) dot products, reduced together.
        match block {
            1 => scores_block::<1, 8, T, RAW>(q, keys, dim, scale, h, scores, ahead),
            2 => scores_block::<2, 4, T, RAW>(q, keys, dim, scale, h, scores, ahead),
            3 => scores_block::<3, 2, T, RAW>(q, keys, dim, scale, h, scores, ahead),
            _ => scores_block::<4, 2, T, RAW>(q, keys, dim, scale, h, scores, ahead),
        }
        h += block;
    }
}

/// Scores of the `HB` heads in `q` (from head `h0` on) against every key, `TB` keys at a time
/// (`HB * TB <= 8`), then one key at a time.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
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
    while t < tokens {
        prefetch_part(ahead, t * dim, TB * dim);
        let mut lanes = [0.0f32; LANES];
        let tb = if t + TB <= tokens {
            let tile = tile_scores::<HB, TB, T, RAW>(q, &keys[t * dim..], dim);
            // SAFETY: `lanes` holds eight f32.
            unsafe {
                _mm256_storeu_ps(
                    lanes.as_mut_ptr(),
                    _mm256_mul_ps(tile, _mm256_set1_ps(scale)),
                )
            };
            TB
        } else {
            let tile = tile_scores::<HB, 1, T, RAW>(q, &keys[t * dim..], dim);
            // SAFETY: as above.
            unsafe {
                _mm256_storeu_ps(
                    lanes.as_mut_ptr(),
                    _mm256_mul_ps(tile, _mm256_set1_ps(scale)),
                )
            };
            1
        };
        for j in 0..HB {
            scores[(h0 + j) * tokens + t..][..tb].copy_from_slice(&lanes[j * tb..][..tb]);
        }
        t += tb;
    }
}

/// Dot products of the `HB` query rows of `q` with the first `TB` key rows of `keys`: lane
/// `j * TB + u` is `q[j] · keys[u]` (with `RAW`, fp8 keys count 2^-8 of their value).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_scores<const HB: usize, const TB: usize, T: KvElem, const RAW: bool>(
    q: &[f32],
    keys: &[T],
    dim: usize,
) -> __m256 {
    assert!(HB * TB <= LANES && q.len() >= HB * dim && keys.len() >= TB * dim);
    let body = dim - dim % LANES;
    let mut acc = [_mm256_setzero_ps(); LANES];
    let mut i = 0;
    while i < body {
        let mut qv = [_mm256_setzero_ps(); HB];
        for (j, qv) in qv.iter_mut().enumerate() {
            // SAFETY: i + 8 <= dim, inside query row j.
            *qv = unsafe { _mm256_loadu_ps(q.as_ptr().add(j * dim + i)) };
        }
        for u in 0..TB {
            // SAFETY: i + 8 <= dim, inside key row u.
            let k = unsafe { widen::<T, RAW>(keys.as_ptr().add(u * dim + i)) };
            for (j, &qv) in qv.iter().enumerate() {
                acc[j * TB + u] = _mm256_fmadd_ps(qv, k, acc[j * TB + u]);
            }
        }
        i += LANES;
    }
    let mut sums = reduce8(acc);
    if body < dim {
        let mut tail = [0.0f32; LANES];
        for j in 0..HB {
            for u in 0..TB {
                tail[j * TB + u] = (body..dim)
                    .map(|c| q[j * dim + c] * widen_one::<T, RAW>(keys[u * dim + c]))
                    .sum();
            }
        }
        // SAFETY: `tail` holds eight f32.
        sums = _mm256_add_ps(sums, unsafe { _mm256_loadu_ps(tail.as_ptr()) });
    }
    sums
}

/// Horizontal sums of eight vectors: lane `i` of the result sums vector `i`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn reduce8(v: [__m256; LANES]) -> __m256 {
    let h01 = _mm256_hadd_ps(v[0], v[1]);
    let h23 = _mm256_hadd_ps(v[2], v[3]);
    let h45 = _mm256_hadd_ps(v[4], v[5]);
    let h67 = _mm256_hadd_ps(v[6], v[7]);
    let (lo, hi) = (_mm256_hadd_ps(h01, h23), _mm256_hadd_ps(h45, h67));
    _mm256_add_ps(
        _mm256_permute2f128_ps::<0x20>(lo, hi),
        _mm256_permute2f128_ps::<0x31>(lo, hi),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
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
#[target_feature(enable = "avx2,fma,f16c")]
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
        // Blocks of about 8 accumulators: few heads take more dims per pass.
        match block {
            1 => accumulate_block::<1, 4, T, RAW>(probs, values, dim, acc, ahead),
            2 => accumulate_block::<2, 4, T, RAW>(probs, values, dim, acc, ahead),
            3 => accumulate_block::<3, 2, T, RAW>(probs, values, dim, acc, ahead),
            _ => accumulate_block::<4, 2, T, RAW>(probs, values, dim, acc, ahead),
        }
        h += block;
    }
}

/// `acc[h] += sum_t probs[h][t] * values[t]` for `HB` heads, `CB * 8` dims at a time so the
/// accumulators stay in registers while the value rows stream by; dims past the last whole
/// vector one at a time.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn accumulate_block<const HB: usize, const CB: usize, T: KvElem, const RAW: bool>(
    probs: &[f32],
    values: &[T],
    dim: usize,
    acc: &mut [f32],
    ahead: &[T],
) {
    let tokens = values.len() / dim;
    assert!(probs.len() == HB * tokens && acc.len() == HB * dim);
    let body = dim - dim % LANES;
    let mut base = 0;
    while base + CB * LANES <= body {
        let ahead = if base == 0 { ahead } else { &[] };
        accumulate_dims::<HB, CB, T, RAW>(probs, values, dim, acc, base, ahead);
        base += CB * LANES;
    }
    while base < body {
        accumulate_dims::<HB, 1, T, RAW>(probs, values, dim, acc, base, &[]);
        base += LANES;
    }
    for j in 0..HB {
        for d in body..dim {
            let mut a = acc[j * dim + d];
            for t in 0..tokens {
                a += probs[j * tokens + t] * values[t * dim + d].to_f32();
            }
            acc[j * dim + d] = a;
        }
    }
}

/// The `CB * 8` dims from `base` of [`accumulate_block`]: `base + CB * 8 <= dim`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn accumulate_dims<const HB: usize, const CB: usize, T: KvElem, const RAW: bool>(
    probs: &[f32],
    values: &[T],
    dim: usize,
    acc: &mut [f32],
    base: usize,
    ahead: &[T],
) {
    let tokens = values.len() / dim;
    assert!(base + CB * LANES <= dim && probs.len() == HB * tokens && acc.len() == HB * dim);
    let factor = raw_factor::<T, RAW>();
    let mut sums = [[_mm256_setzero_ps(); CB]; HB];
    for (j, row) in sums.iter_mut().enumerate() {
        for (c, s) in row.iter_mut().enumerate() {
            // SAFETY: base + c * 8 + 8 <= dim (asserted), inside accumulator row j.
            *s = unsafe { _mm256_loadu_ps(acc.as_ptr().add(j * dim + base + c * LANES)) };
        }
    }
    for t in 0..tokens {
        prefetch_part(ahead, t * dim, dim);
        let mut v = [_mm256_setzero_ps(); CB];
        for (c, vc) in v.iter_mut().enumerate() {
            // SAFETY: as above, inside value row t.
            *vc = unsafe { widen::<T, RAW>(values.as_ptr().add(t * dim + base + c * LANES)) };
        }
        for (j, row) in sums.iter_mut().enumerate() {
            // SAFETY: j < HB and t < tokens, inside `probs` (asserted).
            let p = unsafe { *probs.get_unchecked(j * tokens + t) };
            let p = _mm256_set1_ps(p * factor);
            for (s, &vc) in row.iter_mut().zip(&v) {
                *s = _mm256_fmadd_ps(p, vc, *s);
            }
        }
    }
    for (j, row) in sums.iter().enumerate() {
        for (c, &s) in row.iter().enumerate() {
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(acc.as_mut_ptr().add(j * dim + base + c * LANES), s) };
        }
    }
}
