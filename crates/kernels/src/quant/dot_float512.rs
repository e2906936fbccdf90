//! Float weights (f32, f16, bf16) times f32 activations with AVX-512, 16 weights of a row a
//! multiply-add, in tiles of rows and tokens (`matmul`'s `RowTiles`: three rows by four tokens),
//! so that each widened weight serves every token and each activation load every row.

use core::arch::x86_64::*;

use super::dot_avx2::FloatKind;

const LANES: usize = 16;

/// Sixteen weights of `kind` at `p` (the lanes of `mask`; the others zero) as f32.
///
/// # Safety
/// Each element of a lane set in `mask` must be readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn load(kind: FloatKind, p: *const u8, mask: __mmask16) -> __m512 {
    // SAFETY: the caller vouches for the lanes read.
    unsafe {
        match (kind, mask == !0) {
            (FloatKind::F32, true) => _mm512_loadu_ps(p.cast()),
            (FloatKind::F32, false) => _mm512_maskz_loadu_ps(mask, p.cast()),
            (FloatKind::F16, true) => _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())),
            (FloatKind::F16, false) => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p.cast())),
            (FloatKind::Bf16, full) => {
                let h = if full {
                    _mm256_loadu_si256(p.cast())
                } else {
                    _mm256_maskz_loadu_epi16(mask, p.cast())
                };
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
            }
        }
    }
}

/// Dot products of `R` weight rows of `kind` with `TB` f32 activation rows: `2 R TB`
/// accumulators, each summing every other 16 columns, then the partial last 16 into the first.
/// Each sum is the same however many rows and tokens share the tile.
// Indexed loops, as in `dot_bf16_pairs`' tiles.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub fn tile<const R: usize, const TB: usize>(
    kind: FloatKind,
    w: [&[u8]; R],
    xs: [&[f32]; TB],
) -> [[f32; TB]; R] {
    let n = xs[0].len();
    let eb = kind.bytes();
    assert!(w.iter().all(|w| w.len() == n * eb) && xs.iter().all(|x| x.len() == n));
    let mut acc = [[[_mm512_setzero_ps(); TB]; 2]; R];
    let mut wv = [_mm512_setzero_ps(); R];
    let mut i = 0;
    while i + 2 * LANES <= n {
        for u in 0..2 {
            let j = i + u * LANES;
            for r in 0..R {
                // SAFETY: j + 16 <= n elements of every row and every `x`.
                wv[r] = unsafe { load(kind, w[r].as_ptr().add(j * eb), !0) };
            }
            for t in 0..TB {
                // SAFETY: as above.
                let xv = unsafe { _mm512_loadu_ps(xs[t].as_ptr().add(j)) };
                for r in 0..R {
                    acc[r][u][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][u][t]);
                }
            }
        }
        i += 2 * LANES;
    }
    while i < n {
        let mask = if i + LANES <= n {
            !0
        } else {
            ((1u32 << (n - i)) - 1) as __mmask16
        };
        for r in 0..R {
            // SAFETY: the mask holds lanes inside every row.
            wv[r] = unsafe { load(kind, w[r].as_ptr().add(i * eb), mask) };
        }
        for t in 0..TB {
            // SAFETY: the mask holds lanes inside every `x`.
            let xv = unsafe { _mm512_maskz_loadu_ps(mask, xs[t].as_ptr().add(i)) };
            for r in 0..R {
                acc[r][0][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][0][t]);
            }
        }
        i += LANES;
    }
    let mut out = [[0.0; TB]; R];
    for r in 0..R {
        for t in 0..TB {
            out[r][t] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0][t], acc[r][1][t]));
        }
    }
    out
}
