//! Prefill attention over a block of keys in AVX-512 register tiles, with query rows along the
//! vector lanes: scores `Sᵀ = K Qᵀ`, the online softmax of every row at once, and
//! `Oᵀ = corr Oᵀ + Vᵀ Pᵀ`. Each product keeps 16 accumulators of 16 rows and reads its other
//! operand as broadcasts, so it runs near the FMA rate; the rows' maxima, sums and corrections
//! are vector operations too. Other instruction sets keep the per-row dot products of
//! `prefill.rs`.
//!
//! Layouts, with `rows` a multiple of [`LANES`]: queries `qt` `[dim][rows]` (transposed),
//! keys `k` `[width][dim]`, values `v` `[width][dim_p]`, scores and probabilities `s`
//! `[width][rows]`, output `ot` `[dim_p][rows]` (transposed); `width` and `dim_p` are multiples
//! of [`TILE`], padded with zeros.

use core::arch::x86_64::*;

use crate::simd::avx512::exp;

/// f32 lanes of a vector: query rows a tile spans.
pub const LANES: usize = 16;
/// Keys a score tile spans, and dimensions an output tile spans.
pub const TILE: usize = 16;

/// `s[c][r] = k[c] · qt[..][r]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub fn scores(qt: &[f32], k: &[f32], dim: usize, s: &mut [f32]) {
    let (rows, width) = (qt.len() / dim, k.len() / dim);
    assert!(qt.len() == rows * dim && k.len() == width * dim && s.len() == width * rows);
    assert!(rows.is_multiple_of(LANES) && width.is_multiple_of(TILE));
    for c0 in (0..width).step_by(TILE) {
        for r0 in (0..rows).step_by(LANES) {
            let mut acc = [_mm512_setzero_ps(); TILE];
            for d in 0..dim {
                // SAFETY: d < dim and r0 + 16 <= rows, inside `qt`; c0 + c < width, inside `k`.
                let q = unsafe { _mm512_loadu_ps(qt.as_ptr().add(d * rows + r0)) };
                for (c, acc) in acc.iter_mut().enumerate() {
                    let x = unsafe { *k.get_unchecked((c0 + c) * dim + d) };
                    *acc = _mm512_fmadd_ps(_mm512_set1_ps(x), q, *acc);
                }
            }
            for (c, acc) in acc.iter().enumerate() {
                // SAFETY: c0 + c < width and r0 + 16 <= rows, inside `s`.
                unsafe { _mm512_storeu_ps(s.as_mut_ptr().add((c0 + c) * rows + r0), *acc) };
            }
        }
    }
}

/// The keys each query row sees: positions `from[r]..=to[r]` (none where `to[r]` is negative).
pub struct Visible {
    pub from: Vec<i32>,
    pub to: Vec<i32>,
}

/// One online-softmax step of every row over the keys `first..first + keys` whose scores are in
/// `s` (the first `keys` of its `width`): row `r` sees the keys `visible` gives it. Turns `s` into the block's weights (zero where not seen), folds the
/// block into the rows' maxima `m` and sums `l`, and writes the factor each row's output must
/// be scaled by first into `corr`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub fn softmax(
    s: &mut [f32],
    first: usize,
    keys: usize,
    visible: &Visible,
    m: &mut [f32],
    l: &mut [f32],
    corr: &mut [f32],
) {
    let rows = visible.to.len();
    let width = s.len() / rows;
    assert!(rows.is_multiple_of(LANES) && s.len() == width * rows && keys <= width);
    assert!(m.len() == rows && l.len() == rows && corr.len() == rows);
    assert!(visible.from.len() == rows);
    let sp = s.as_mut_ptr();
    for r0 in (0..rows).step_by(LANES) {
        // SAFETY (every access below): r0 + 16 <= rows, and c < width, inside each slice.
        let seen_to = unsafe { _mm512_loadu_si512(visible.to.as_ptr().add(r0).cast()) };
        let seen_from = unsafe { _mm512_loadu_si512(visible.from.as_ptr().add(r0).cast()) };
        let seen = |c: usize| {
            let key = _mm512_set1_epi32((first + c) as i32);
            _mm512_cmple_epi32_mask(key, seen_to) & _mm512_cmpge_epi32_mask(key, seen_from)
        };
        let mut mx = _mm512_set1_ps(f32::NEG_INFINITY);
        for c in 0..keys {
            let x = unsafe { _mm512_loadu_ps(sp.add(c * rows + r0)) };
            mx = _mm512_mask_max_ps(mx, seen(c), mx, x);
        }
        let m_old = unsafe { _mm512_loadu_ps(m.as_ptr().add(r0)) };
        let m_new = _mm512_max_ps(m_old, mx);
        // A row that has seen no key yet keeps weights of zero.
        let none = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(m_new, _mm512_set1_ps(f32::NEG_INFINITY));
        let base = _mm512_mask_mov_ps(m_new, none, _mm512_setzero_ps());
        let cr = exp(_mm512_sub_ps(m_old, base));
        let mut sum = _mm512_setzero_ps();
        for c in 0..width {
            let p = unsafe { sp.add(c * rows + r0) };
            let mask = if c < keys { seen(c) } else { 0 };
            let e = _mm512_maskz_mov_ps(
                mask,
                exp(_mm512_sub_ps(unsafe { _mm512_loadu_ps(p) }, base)),
            );
            unsafe { _mm512_storeu_ps(p, e) };
            sum = _mm512_add_ps(sum, e);
        }
        unsafe {
            let l_old = _mm512_loadu_ps(l.as_ptr().add(r0));
            _mm512_storeu_ps(l.as_mut_ptr().add(r0), _mm512_fmadd_ps(l_old, cr, sum));
            _mm512_storeu_ps(m.as_mut_ptr().add(r0), m_new);
            _mm512_storeu_ps(corr.as_mut_ptr().add(r0), cr);
        }
    }
}

/// `ot[d][r] = corr[r] ot[d][r] + sum_c v[c][d] p[c][r]`. With `SKIP_ZEROS`, a weight of zero
/// adds nothing even to a value that is not finite (keys a row must not see).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub fn accumulate<const SKIP_ZEROS: bool>(
    p: &[f32],
    v: &[f32],
    dim_p: usize,
    corr: &[f32],
    ot: &mut [f32],
) {
    let rows = corr.len();
    let width = v.len() / dim_p;
    assert!(rows.is_multiple_of(LANES) && dim_p.is_multiple_of(TILE));
    assert!(p.len() == width * rows && v.len() == width * dim_p && ot.len() == dim_p * rows);
    for d0 in (0..dim_p).step_by(TILE) {
        for r0 in (0..rows).step_by(LANES) {
            // SAFETY (every access below): d0 + d < dim_p, c < width and r0 + 16 <= rows,
            // inside each slice.
            let cr = unsafe { _mm512_loadu_ps(corr.as_ptr().add(r0)) };
            let mut acc: [__m512; TILE] = std::array::from_fn(|d| {
                _mm512_mul_ps(cr, unsafe {
                    _mm512_loadu_ps(ot.as_ptr().add((d0 + d) * rows + r0))
                })
            });
            for c in 0..width {
                let w = unsafe { _mm512_loadu_ps(p.as_ptr().add(c * rows + r0)) };
                let weighs = if SKIP_ZEROS {
                    _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(w, _mm512_setzero_ps())
                } else {
                    !0
                };
                for (d, acc) in acc.iter_mut().enumerate() {
                    let x = _mm512_set1_ps(unsafe { *v.get_unchecked(c * dim_p + d0 + d) });
                    *acc = if SKIP_ZEROS {
                        _mm512_mask3_fmadd_ps(x, w, *acc, weighs)
                    } else {
                        _mm512_fmadd_ps(x, w, *acc)
                    };
                }
            }
            for (d, acc) in acc.iter().enumerate() {
                unsafe { _mm512_storeu_ps(ot.as_mut_ptr().add((d0 + d) * rows + r0), *acc) };
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::simd::{Level, Simd};

    /// `n` values in [-1, 1) from a multiplicative hash of their index and `seed`.
    pub(crate) fn pseudo(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    #[test]
    fn tiles_match_plain_products() {
        if Simd::with_level(Level::Avx512).is_none() {
            return;
        }
        let (rows, width, dim) = (32, 32, 48);
        let qt = pseudo(dim * rows, 1);
        let k = pseudo(width * dim, 2);
        let mut s = vec![0.0; width * rows];
        // SAFETY: AVX-512 was detected above.
        unsafe { scores(&qt, &k, dim, &mut s) };
        for c in 0..width {
            for r in 0..rows {
                let want: f32 = (0..dim).map(|d| qt[d * rows + r] * k[c * dim + d]).sum();
                assert!((s[c * rows + r] - want).abs() < 1e-4, "score {c} {r}");
            }
        }
        let v = pseudo(width * dim, 4);
        let ot0 = pseudo(dim * rows, 5);
        let corr = pseudo(rows, 6);
        for skip_zeros in [false, true] {
            let mut ot = ot0.clone();
            // SAFETY: as above.
            unsafe {
                if skip_zeros {
                    accumulate::<true>(&s, &v, dim, &corr, &mut ot)
                } else {
                    accumulate::<false>(&s, &v, dim, &corr, &mut ot)
                }
            };
            for d in 0..dim {
                for r in 0..rows {
                    let want = corr[r] * ot0[d * rows + r]
                        + (0..width)
                            .map(|c| v[c * dim + d] * s[c * rows + r])
                            .sum::<f32>();
                    assert!((ot[d * rows + r] - want).abs() < 1e-3, "output {d} {r}");
                }
            }
        }
    }
}
