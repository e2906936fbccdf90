//! Float weights stored as bf16 multiplied on bf16 pairs (`vdpbf16ps`), where the CPU has
//! AVX-512 BF16 ([`Isa::detect`](super::Isa::detect)): one instruction multiplies and
//! adds 32 weights of a row with 32 activations rounded to bf16, where the f32 kernels widen
//! every weight and multiply-add eight at a time. Every sum stays f32.

use core::arch::x86_64::*;

/// Weights (and activations) one pair product takes: 32 bf16, 512 bits.
const PAIR: usize = 32;

/// The lanes of `mask` of 32 bf16 at `p`, the others zero (a full mask: a plain load).
///
/// # Safety
/// Each lane set in `mask` must be readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn load(p: *const u16, mask: __mmask32) -> __m512bh {
    // SAFETY: the caller vouches for the lanes read.
    let v = unsafe {
        if mask == !0 {
            _mm512_loadu_ps(p.cast())
        } else {
            _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(mask, p.cast()))
        }
    };
    as_pairs(v)
}

/// `v`'s bits as 32 bf16.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
fn as_pairs(v: __m512) -> __m512bh {
    // SAFETY: every bit pattern is a valid vector of either type.
    unsafe { std::mem::transmute::<__m512, __m512bh>(v) }
}

/// The lanes below `len` of 32 (all where `len >= 32`).
#[inline]
fn lanes_below(len: usize) -> __mmask32 {
    if len >= PAIR { !0 } else { (1u32 << len) - 1 }
}

/// Dot products of `R` rows of bf16 weights (little-endian bytes) with `TB` activation rows in
/// bf16 bits: `2 R TB` accumulators, each summing every other 32 columns, then the partial last
/// 32 into the first. Each sum is the same however many rows and tokens share the tile.
// Indexed loops: a build with iterator closures here left some of them out of line, 10-15%
// slower.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub fn tile<const R: usize, const TB: usize>(w: [&[u8]; R], xs: [&[u16]; TB]) -> [[f32; TB]; R] {
    let n = w[0].len() / 2;
    assert!(w.iter().all(|w| w.len() == 2 * n) && xs.iter().all(|x| x.len() == n));
    let mut wp = [std::ptr::null::<u16>(); R];
    for r in 0..R {
        wp[r] = w[r].as_ptr().cast();
    }
    let mut acc = [[[_mm512_setzero_ps(); TB]; 2]; R];
    let mut wv = [as_pairs(_mm512_setzero_ps()); R];
    let mut i = 0;
    // Whole pairs of 32 alternate between the two accumulators.
    while i + 2 * PAIR <= n {
        for u in 0..2 {
            let j = i + u * PAIR;
            for r in 0..R {
                // SAFETY: j + 32 <= n elements of every row and every `x`.
                wv[r] = unsafe { load(wp[r].add(j), !0) };
            }
            for t in 0..TB {
                // SAFETY: as above.
                let xv = unsafe { load(xs[t].as_ptr().add(j), !0) };
                for r in 0..R {
                    acc[r][u][t] = _mm512_dpbf16_ps(acc[r][u][t], wv[r], xv);
                }
            }
        }
        i += 2 * PAIR;
    }
    // The rest, 32 at a time into the first (lanes past the end read as zero).
    while i < n {
        let mask = lanes_below(n - i);
        for r in 0..R {
            // SAFETY: the mask holds lanes inside every row and every `x` alone.
            wv[r] = unsafe { load(wp[r].add(i), mask) };
        }
        for t in 0..TB {
            // SAFETY: as above.
            let xv = unsafe { load(xs[t].as_ptr().add(i), mask) };
            for r in 0..R {
                acc[r][0][t] = _mm512_dpbf16_ps(acc[r][0][t], wv[r], xv);
            }
        }
        i += PAIR;
    }
    let mut out = [[0.0; TB]; R];
    for r in 0..R {
        for t in 0..TB {
            out[r][t] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0][t], acc[r][1][t]));
        }
    }
    out
}
