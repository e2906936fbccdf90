//! The two products of the register tiles (`prefill_tiles.rs`) on bf16 pairs, for a bf16 or
//! fp8 KV pool on a CPU with AVX-512 BF16: one `vdpbf16ps` multiplies and adds two dimensions
//! (scores) or two keys (output) for 16 rows, twice the work of an f32 multiply-add at the same
//! rate. Keys and values keep the pool's values (bf16 holds every fp8 value exactly); queries
//! and the softmax weights are rounded to bf16 (as the GPU's tensor cores take them), and every
//! sum stays f32.
//!
//! Layouts, a pair being one `u32` of two bf16 (the lower one first): queries `qt` `[dim / 2]
//! [rows]` (pairs of dimensions), keys `k` `[width][dim]` bf16, values `v` `[width / 2]
//! [dim_p]` (pairs of keys), weights `p` `[width / 2][rows]` (pairs of keys), scores `s`
//! `[width][rows]` f32 and output `ot` `[dim_p][rows]` f32 as in `prefill_tiles.rs`.

use core::arch::x86_64::*;

use crate::prefill_tiles::{LANES, TILE};

/// Whether this CPU has what the pair products need: AVX-512 with its bf16 dot products. (Where
/// the kernels take them: [`crate::simd::bf16_pairs`].)
#[cfg(test)]
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512bf16")
}

/// The bf16 bits of `x`, rounded to nearest even (as `vcvtneps2bf16` rounds).
pub fn bf16_bits(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

/// Word `2i` of the result is word `i` of a 512-bit value, word `2i + 1` its word `16 + i`:
/// two vectors of 16 bf16 side by side become 16 pairs.
#[target_feature(enable = "avx512f,avx512bw")]
fn interleave_halves(x: __m512i) -> __m512i {
    let idx = _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4,
        19, 3, 18, 2, 17, 1, 16, 0,
    );
    _mm512_permutexvar_epi16(idx, x)
}

/// `s[c][r] = k[c] · q[..][r]`, the query's dimensions in pairs (`dim` even).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub fn scores(qt: &[u32], k: &[u16], dim: usize, s: &mut [f32]) {
    let pairs = dim / 2;
    let (rows, width) = (qt.len() / pairs, k.len() / dim);
    assert!(dim.is_multiple_of(2) && qt.len() == rows * pairs && k.len() == width * dim);
    assert!(s.len() == width * rows && rows.is_multiple_of(LANES) && width.is_multiple_of(TILE));
    for c0 in (0..width).step_by(TILE) {
        for r0 in (0..rows).step_by(LANES) {
            let mut acc = [_mm512_setzero_ps(); TILE];
            for d in 0..pairs {
                // SAFETY: d < pairs and r0 + 16 <= rows, inside `qt`; c0 + c < width and
                // 2d + 1 < dim, inside `k` (a pair read as one unaligned u32).
                let q = unsafe { _mm512_loadu_si512(qt.as_ptr().add(d * rows + r0).cast()) };
                for (c, acc) in acc.iter_mut().enumerate() {
                    let kp = unsafe {
                        k.as_ptr()
                            .add((c0 + c) * dim + 2 * d)
                            .cast::<u32>()
                            .read_unaligned()
                    };
                    let kv = _mm512_set1_epi32(kp as i32);
                    *acc = _mm512_dpbf16_ps(*acc, pairs_of(kv), pairs_of(q));
                }
            }
            for (c, acc) in acc.iter().enumerate() {
                // SAFETY: c0 + c < width and r0 + 16 <= rows, inside `s`.
                unsafe { _mm512_storeu_ps(s.as_mut_ptr().add((c0 + c) * rows + r0), *acc) };
            }
        }
    }
}

/// `p[c / 2][r]`: the weights `s[c][r]` (`[width][rows]`, `width` even) rounded to bf16,
/// two keys a pair.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub fn weight_pairs(s: &[f32], rows: usize, p: &mut [u32]) {
    let width = s.len() / rows;
    assert!(width.is_multiple_of(2) && s.len() == width * rows && p.len() == width / 2 * rows);
    assert!(rows.is_multiple_of(LANES));
    for c in 0..width / 2 {
        for r0 in (0..rows).step_by(LANES) {
            // SAFETY: 2c + 1 < width and r0 + 16 <= rows, inside `s` and `p`.
            unsafe {
                let a = _mm512_loadu_ps(s.as_ptr().add(2 * c * rows + r0));
                let b = _mm512_loadu_ps(s.as_ptr().add((2 * c + 1) * rows + r0));
                let both = _mm512_castps_si512(bh_bits(_mm512_cvtne2ps_pbh(b, a)));
                _mm512_storeu_si512(
                    p.as_mut_ptr().add(c * rows + r0).cast(),
                    interleave_halves(both),
                );
            }
        }
    }
}

/// `dst = src` as bf16 bits, rounded to nearest even (every element by the instruction, a
/// last partial 16 through a mask).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub fn narrow_into(dst: &mut [u16], src: &[f32]) {
    assert_eq!(dst.len(), src.len());
    for i in (0..src.len()).step_by(LANES) {
        let (s, d) = (
            src.as_ptr().wrapping_add(i),
            dst.as_mut_ptr().wrapping_add(i),
        );
        // SAFETY: a whole 16 lies inside both slices; a partial one is read and written only
        // through a mask of the lanes inside them.
        unsafe {
            if i + LANES <= src.len() {
                let x = _mm512_cvtneps_pbh(_mm512_loadu_ps(s));
                _mm256_storeu_si256(d.cast(), std::mem::transmute::<__m256bh, __m256i>(x));
            } else {
                let mask = ((1u32 << (src.len() - i)) - 1) as __mmask16;
                let x = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, s));
                let bits = std::mem::transmute::<__m256bh, __m256i>(x);
                _mm256_mask_storeu_epi16(d.cast(), mask, bits);
            }
        }
    }
}

/// `v[c / 2][d]`: the values of keys `c` (even) and `c + 1`, rows `a` and `b` of 16 bf16
/// dimensions each, as 16 pairs.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub fn value_pairs(a: &[u16], b: &[u16], out: &mut [u32]) {
    assert!(a.len() == LANES && b.len() == LANES && out.len() == LANES);
    // SAFETY: each slice holds 16 elements (checked).
    unsafe {
        let lo = _mm256_loadu_si256(a.as_ptr().cast());
        let hi = _mm256_loadu_si256(b.as_ptr().cast());
        let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
        _mm512_storeu_si512(out.as_mut_ptr().cast(), interleave_halves(both));
    }
}

/// `ot[d][r] = corr[r] ot[d][r] + sum_c v[c][d] p[c][r]`, keys in pairs. Every weight must
/// meet a finite value (no key masked from some rows; `prefill_tiles::accumulate` takes
/// those blocks).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub fn accumulate(p: &[u32], v: &[u32], dim_p: usize, corr: &[f32], ot: &mut [f32]) {
    let rows = corr.len();
    let key_pairs = v.len() / dim_p;
    assert!(rows.is_multiple_of(LANES) && dim_p.is_multiple_of(TILE));
    assert!(p.len() == key_pairs * rows && v.len() == key_pairs * dim_p);
    assert!(ot.len() == dim_p * rows);
    for d0 in (0..dim_p).step_by(TILE) {
        for r0 in (0..rows).step_by(LANES) {
            // SAFETY (every access below): d0 + d < dim_p, c < key_pairs and r0 + 16 <= rows,
            // inside each slice.
            let cr = unsafe { _mm512_loadu_ps(corr.as_ptr().add(r0)) };
            let mut acc: [__m512; TILE] = std::array::from_fn(|d| {
                _mm512_mul_ps(cr, unsafe {
                    _mm512_loadu_ps(ot.as_ptr().add((d0 + d) * rows + r0))
                })
            });
            for c in 0..key_pairs {
                let w = unsafe { _mm512_loadu_si512(p.as_ptr().add(c * rows + r0).cast()) };
                for (d, acc) in acc.iter_mut().enumerate() {
                    let x =
                        _mm512_set1_epi32(unsafe { *v.get_unchecked(c * dim_p + d0 + d) } as i32);
                    *acc = _mm512_dpbf16_ps(*acc, pairs_of(x), pairs_of(w));
                }
            }
            for (d, acc) in acc.iter().enumerate() {
                unsafe { _mm512_storeu_ps(ot.as_mut_ptr().add((d0 + d) * rows + r0), *acc) };
            }
        }
    }
}

/// 32 bf16 as the dot product takes them.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
pub(crate) fn pairs_of(x: __m512i) -> __m512bh {
    // SAFETY: both are 512 bits of plain data.
    unsafe { std::mem::transmute(x) }
}

/// The bits of 32 bf16.
#[target_feature(enable = "avx512f,avx512bf16")]
fn bh_bits(x: __m512bh) -> __m512 {
    // SAFETY: both are 512 bits of plain data.
    unsafe { std::mem::transmute(x) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prefill_tiles::tests::pseudo;

    fn round(x: f32) -> f32 {
        half::bf16::from_f32(x).to_f32()
    }

    #[test]
    fn pair_products_match_plain_products_of_bf16_values() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX-512 BF16");
            return;
        }
        let (rows, width, dim) = (32, 32, 48);
        let q = pseudo(rows * dim, 1);
        let k: Vec<u16> = pseudo(width * dim, 2)
            .iter()
            .map(|&x| bf16_bits(x))
            .collect();
        let qt: Vec<u32> = (0..dim / 2)
            .flat_map(|d| {
                let q = &q;
                (0..rows).map(move |r| {
                    bf16_bits(q[r * dim + 2 * d]) as u32
                        | (bf16_bits(q[r * dim + 2 * d + 1]) as u32) << 16
                })
            })
            .collect();
        let kf = |c: usize, d: usize| half::bf16::from_bits(k[c * dim + d]).to_f32();
        let mut s = vec![0.0; width * rows];
        // SAFETY: the features were detected above.
        unsafe { scores(&qt, &k, dim, &mut s) };
        for c in 0..width {
            for r in 0..rows {
                let want: f32 = (0..dim).map(|d| round(q[r * dim + d]) * kf(c, d)).sum();
                assert!((s[c * rows + r] - want).abs() < 1e-4, "score {c} {r}");
            }
        }
        let mut p = vec![0u32; width / 2 * rows];
        // SAFETY: as above.
        unsafe { weight_pairs(&s, rows, &mut p) };
        for c in 0..width {
            for r in 0..rows {
                let bits = (p[c / 2 * rows + r] >> (16 * (c % 2))) as u16;
                assert_eq!(bits, bf16_bits(s[c * rows + r]), "weight {c} {r}");
            }
        }
        let v: Vec<u16> = pseudo(width * dim, 4)
            .iter()
            .map(|&x| bf16_bits(x))
            .collect();
        let mut vp = vec![0u32; width / 2 * dim];
        for c in 0..width / 2 {
            for d0 in (0..dim).step_by(LANES) {
                let (a, b) = (
                    &v[2 * c * dim + d0..][..LANES],
                    &v[(2 * c + 1) * dim + d0..][..LANES],
                );
                // SAFETY: as above.
                unsafe { value_pairs(a, b, &mut vp[c * dim + d0..][..LANES]) };
            }
        }
        let ot0 = pseudo(dim * rows, 5);
        let corr = pseudo(rows, 6);
        let mut ot = ot0.clone();
        // SAFETY: as above.
        unsafe { accumulate(&p, &vp, dim, &corr, &mut ot) };
        let vf = |c: usize, d: usize| half::bf16::from_bits(v[c * dim + d]).to_f32();
        for d in 0..dim {
            for r in 0..rows {
                let want = corr[r] * ot0[d * rows + r]
                    + (0..width)
                        .map(|c| vf(c, d) * round(s[c * rows + r]))
                        .sum::<f32>();
                assert!((ot[d * rows + r] - want).abs() < 1e-3, "output {d} {r}");
            }
        }
    }
}
