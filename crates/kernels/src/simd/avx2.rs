//! AVX2 + FMA + F16C: 8 f32 lanes.

use core::arch::x86_64::*;

use vortex_kv::{KvDtype, KvElem};

const LANES: usize = 8;

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

/// The eight e4m3 bytes in the low half of `b` to f32. The magnitude bits moved into an
/// f16's exponent and mantissa give the value times 2^-8 (an f16 subnormal when e = 0, which
/// the f16 conversion reads exactly); one product scales it back. The NaN byte is made a NaN.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fp8_to_f32(b: __m128i) -> __m256 {
    let w = _mm_cvtepu8_epi16(b);
    let low7 = _mm_and_si128(w, _mm_set1_epi16(0x7f));
    let sign = _mm_slli_epi16::<8>(_mm_and_si128(w, _mm_set1_epi16(0x80)));
    let h = _mm_or_si128(_mm_slli_epi16::<7>(low7), sign);
    let v = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0));
    let nan = _mm256_cvtepi16_epi32(_mm_cmpeq_epi16(low7, _mm_set1_epi16(0x7f)));
    _mm256_blendv_ps(v, _mm256_set1_ps(f32::NAN), _mm256_castsi256_ps(nan))
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
pub fn group_scores<T: KvElem>(q: &[f32], keys: &[T], dim: usize, scale: f32, scores: &mut [f32]) {
    let tokens = keys.len() / dim;
    for (qh, row) in q.chunks_exact(dim).zip(scores.chunks_exact_mut(tokens)) {
        for (s, k) in row.iter_mut().zip(keys.chunks_exact(dim)) {
            *s = scale * dot(qh, k);
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn group_accumulate<T: KvElem>(probs: &[f32], values: &[T], dim: usize, acc: &mut [f32]) {
    let tokens = values.len() / dim;
    for (a, p) in acc.chunks_exact_mut(dim).zip(probs.chunks_exact(tokens)) {
        for (&w, v) in p.iter().zip(values.chunks_exact(dim)) {
            axpy(a, w, v);
        }
    }
}
