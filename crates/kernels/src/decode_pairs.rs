//! Decode attention's two products on bf16 pairs, for a bf16 KV pool on a CPU with AVX-512
//! BF16 (taken where `simd::bf16_pairs` says they pay: AMD's cores): one `vdpbf16ps` multiplies and adds two dimensions (scores) or two keys (weighted
//! values) in each of 16 lanes, where the f32 loops widen every stored value and multiply-add
//! it on its own. Keys and values are read as stored; queries and softmax weights are rounded
//! to bf16 (as in prefill, `prefill_pairs.rs`, and on the GPU's tensor cores), and every sum
//! stays f32.
//!
//! Weighted values accumulate in *pair order*: within each 32 dimensions, lanes `4l + i` of the
//! first 16 floats hold dimension `8l + i` and those of the next 16 dimension `8l + 4 + i`
//! (`l, i < 4`), the order in which `vpunpck{l,h}wd` leave two value rows; [`unpair`] restores
//! the dimensions' order.

use core::arch::x86_64::*;

use crate::prefill_pairs::pairs_of;
use crate::simd::avx512::reduce16;
use crate::simd::prefetch_part;

const LANES: usize = 16;
/// Dimensions one pair product takes: 32 bf16, 512 bits.
pub const PAIR_DIMS: usize = 32;
/// Query heads handled together, their accumulators in registers.
const HEAD_BLOCK: usize = 4;
/// The most tokens a page holds (page sizes are powers of two up to 256).
const MAX_TOKENS: usize = 256;

/// `dst = src` as bf16 bits, rounded to nearest even.
pub use crate::prefill_pairs::narrow_into;

/// `scores[h][t] = scale * q[h] · keys[t]` for the query rows `q` (`[heads][dim]`) and the key
/// rows `keys` (`[tokens][dim]`), both bf16 bits, `dim` a multiple of [`PAIR_DIMS`]; starts
/// fetching `ahead` meanwhile.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub fn scores(q: &[u16], keys: &[u16], dim: usize, scale: f32, scores: &mut [f32], ahead: &[u16]) {
    assert!(dim > 0 && dim.is_multiple_of(PAIR_DIMS));
    let (heads, tokens) = (q.len() / dim, keys.len() / dim);
    assert!(q.len() == heads * dim && keys.len() == tokens * dim);
    assert!(scores.len() >= heads * tokens);
    let mut h = 0;
    while h < heads {
        let block = (heads - h).min(HEAD_BLOCK);
        let q = &q[h * dim..(h + block) * dim];
        // Later head blocks find the keys in cache; the first one fetches the next block.
        let ahead = if h == 0 { ahead } else { &[] };
        // Tiles of 16 (head, key) dot products, reduced together.
        match block {
            1 => scores_block::<1, 16>(q, keys, dim, scale, h, scores, ahead),
            2 => scores_block::<2, 8>(q, keys, dim, scale, h, scores, ahead),
            3 => scores_block::<3, 4>(q, keys, dim, scale, h, scores, ahead),
            _ => scores_block::<4, 4>(q, keys, dim, scale, h, scores, ahead),
        }
        h += block;
    }
}

/// The scores of the `HB` query rows of `q` (heads `h0..`), `TB` keys at a time.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
#[allow(clippy::too_many_arguments)]
fn scores_block<const HB: usize, const TB: usize>(
    q: &[u16],
    keys: &[u16],
    dim: usize,
    scale: f32,
    h0: usize,
    scores: &mut [f32],
    ahead: &[u16],
) {
    let tokens = keys.len() / dim;
    let mut t = 0;
    while t < tokens {
        let rows = (tokens - t).min(TB);
        prefetch_part(ahead, t * dim, rows * dim);
        let keys = &keys[t * dim..(t + rows) * dim];
        let tile = if rows == TB {
            tile_scores::<HB, TB>(q, keys, dim, TB)
        } else {
            tile_scores::<HB, TB>(q, keys, dim, rows)
        };
        let mut lanes = [0.0f32; LANES];
        // SAFETY: `lanes` holds sixteen f32.
        unsafe {
            _mm512_storeu_ps(
                lanes.as_mut_ptr(),
                _mm512_mul_ps(tile, _mm512_set1_ps(scale)),
            )
        };
        for j in 0..HB {
            scores[(h0 + j) * tokens + t..][..rows].copy_from_slice(&lanes[j * TB..][..rows]);
        }
        t += rows;
    }
}

/// Lane `j * TB + u` is `q[j] · keys[u]` for the first `rows <= TB` key rows (the others 0).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
fn tile_scores<const HB: usize, const TB: usize>(
    q: &[u16],
    keys: &[u16],
    dim: usize,
    rows: usize,
) -> __m512 {
    assert!(HB * TB <= LANES && rows <= TB && q.len() >= HB * dim && keys.len() >= rows * dim);
    let mut acc = [_mm512_setzero_ps(); LANES];
    for i in (0..dim).step_by(PAIR_DIMS) {
        // SAFETY: i + 32 <= dim (a multiple of 32), inside query row j and key row u.
        let qv: [__m512bh; HB] = std::array::from_fn(|j| unsafe { load_pairs(q, j * dim + i) });
        for u in 0..rows {
            let k = unsafe { load_pairs(keys, u * dim + i) };
            for (j, &qv) in qv.iter().enumerate() {
                acc[j * TB + u] = _mm512_dpbf16_ps(acc[j * TB + u], qv, k);
            }
        }
    }
    reduce16(acc)
}

/// `acc[h] += sum_t probs[h][t] values[t]` for the heads of `acc` (`[heads][dim]`, in pair
/// order), `probs` `[heads][tokens]` and the value rows `values` (`[tokens][dim]` bf16 bits,
/// at most 256 of them), `dim` a multiple of [`PAIR_DIMS`]; starts fetching `ahead`
/// meanwhile. An odd last token is paired with a weight of zero.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub fn accumulate(probs: &[f32], values: &[u16], dim: usize, acc: &mut [f32], ahead: &[u16]) {
    assert!(dim > 0 && dim.is_multiple_of(PAIR_DIMS));
    let (heads, tokens) = (acc.len() / dim, values.len() / dim);
    assert!(acc.len() == heads * dim && values.len() == tokens * dim && tokens <= MAX_TOKENS);
    assert!(probs.len() == heads * tokens);
    let mut weights = [[0u32; MAX_TOKENS / 2]; HEAD_BLOCK];
    let mut h = 0;
    while h < heads {
        let block = (heads - h).min(HEAD_BLOCK);
        for (j, w) in weights.iter_mut().take(block).enumerate() {
            weight_pairs(&probs[(h + j) * tokens..][..tokens], w);
        }
        let acc = &mut acc[h * dim..(h + block) * dim];
        let ahead = if h == 0 { ahead } else { &[] };
        match block {
            1 => accumulate_block::<1>(&weights, values, dim, acc, ahead),
            2 => accumulate_block::<2>(&weights, values, dim, acc, ahead),
            3 => accumulate_block::<3>(&weights, values, dim, acc, ahead),
            _ => accumulate_block::<4>(&weights, values, dim, acc, ahead),
        }
        h += block;
    }
}

/// `w[i]`: the weights of tokens `2i` and `2i + 1` of `p` as bf16 bits, the first in the low
/// half (zero past the end of `p`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
fn weight_pairs(p: &[f32], w: &mut [u32; MAX_TOKENS / 2]) {
    for i in (0..p.len()).step_by(LANES) {
        let n = (p.len() - i).min(LANES);
        let mask = ((1u32 << n) - 1) as __mmask16;
        // SAFETY: the mask covers only elements of `p`; i / 2 + 8 <= 128 as p.len() <= 256.
        unsafe {
            let x = _mm512_maskz_loadu_ps(mask, p.as_ptr().add(i));
            let bits: __m256i = std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(x));
            _mm256_storeu_si256(w.as_mut_ptr().add(i / 2).cast(), bits);
        }
    }
}

/// [`accumulate`] for the `HB` heads of `acc`, 64 dimensions a pass (32 in a last odd one).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
fn accumulate_block<const HB: usize>(
    weights: &[[u32; MAX_TOKENS / 2]; HEAD_BLOCK],
    values: &[u16],
    dim: usize,
    acc: &mut [f32],
    ahead: &[u16],
) {
    let mut base = 0;
    while base < dim {
        let ahead = if base == 0 { ahead } else { &[] };
        if dim - base >= 2 * PAIR_DIMS {
            accumulate_pass::<HB, 2>(weights, values, dim, base, acc, ahead);
            base += 2 * PAIR_DIMS;
        } else {
            accumulate_pass::<HB, 1>(weights, values, dim, base, acc, ahead);
            base += PAIR_DIMS;
        }
    }
}

/// Dimensions `base..base + 32 CB` of [`accumulate_block`]: `2 CB` accumulators a head.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
fn accumulate_pass<const HB: usize, const CB: usize>(
    weights: &[[u32; MAX_TOKENS / 2]; HEAD_BLOCK],
    values: &[u16],
    dim: usize,
    base: usize,
    acc: &mut [f32],
    ahead: &[u16],
) {
    let tokens = values.len() / dim;
    assert!(HB <= HEAD_BLOCK && acc.len() == HB * dim && base + CB * PAIR_DIMS <= dim);
    let mut sums = [[_mm512_setzero_ps(); 4]; HB];
    for (j, row) in sums.iter_mut().enumerate() {
        for (m, s) in row.iter_mut().take(2 * CB).enumerate() {
            // SAFETY: base + 16 m + 16 <= base + 32 CB <= dim, inside head j's row.
            *s = unsafe { _mm512_loadu_ps(acc.as_ptr().add(j * dim + base + m * LANES)) };
        }
    }
    for t in (0..tokens).step_by(2) {
        prefetch_part(ahead, t * dim, 2 * dim);
        let mut x = [_mm512_setzero_si512(); 4];
        for c in 0..CB {
            let at = base + c * PAIR_DIMS;
            // SAFETY: t < tokens and at + 32 <= dim, inside row t; row t + 1 likewise when it
            // exists.
            let a = unsafe { _mm512_loadu_si512(values.as_ptr().add(t * dim + at).cast()) };
            let b = if t + 1 < tokens {
                unsafe { _mm512_loadu_si512(values.as_ptr().add((t + 1) * dim + at).cast()) }
            } else {
                _mm512_setzero_si512()
            };
            x[2 * c] = _mm512_unpacklo_epi16(a, b);
            x[2 * c + 1] = _mm512_unpackhi_epi16(a, b);
        }
        for (j, row) in sums.iter_mut().enumerate() {
            let w = pairs_of(_mm512_set1_epi32(weights[j][t / 2] as i32));
            for (s, &x) in row.iter_mut().zip(&x).take(2 * CB) {
                *s = _mm512_dpbf16_ps(*s, pairs_of(x), w);
            }
        }
    }
    for (j, row) in sums.iter().enumerate() {
        for (m, &s) in row.iter().take(2 * CB).enumerate() {
            // SAFETY: as the loads above.
            unsafe { _mm512_storeu_ps(acc.as_mut_ptr().add(j * dim + base + m * LANES), s) };
        }
    }
}

/// Puts accumulators in pair order ([`accumulate`]) back in the dimensions' order
/// (`acc.len()` a multiple of [`PAIR_DIMS`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub fn unpair(acc: &mut [f32]) {
    assert!(acc.len().is_multiple_of(PAIR_DIMS));
    let first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    let second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for chunk in acc.chunks_exact_mut(PAIR_DIMS) {
        // SAFETY: the chunk holds 32 f32.
        unsafe {
            let p = chunk.as_mut_ptr();
            let (lo, hi) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(LANES)));
            _mm512_storeu_ps(p, _mm512_permutex2var_ps(lo, first, hi));
            _mm512_storeu_ps(p.add(LANES), _mm512_permutex2var_ps(lo, second, hi));
        }
    }
}

/// 32 bf16 at `x[at..]` as the dot product takes them.
///
/// # Safety
/// `x[at..at + 32]` must be in bounds.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn load_pairs(x: &[u16], at: usize) -> __m512bh {
    // SAFETY: the caller vouches for the 64 bytes.
    pairs_of(unsafe { _mm512_loadu_si512(x.as_ptr().add(at).cast()) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prefill_tiles::tests::pseudo;

    fn bits(x: &[f32]) -> Vec<u16> {
        x.iter()
            .map(|&x| half::bf16::from_f32(x).to_bits())
            .collect()
    }

    fn value(b: u16) -> f64 {
        half::bf16::from_bits(b).to_f32() as f64
    }

    #[test]
    fn pair_products_match_products_of_the_rounded_values() {
        if !crate::prefill_pairs::available() {
            eprintln!("skipped: this CPU has no AVX-512 BF16");
            return;
        }
        // Head counts around the head block, odd and full pages, dims with a 32-wide pass.
        for (heads, tokens, dim) in [
            (1, 16, 64),
            (3, 7, 96),
            (4, 16, 128),
            (6, 1, 32),
            (9, 33, 64),
        ] {
            let (q, k, v) = (
                bits(&pseudo(heads * dim, 1)),
                bits(&pseudo(tokens * dim, 2)),
                bits(&pseudo(tokens * dim, 3)),
            );
            let mut s = vec![0.0f32; heads * tokens];
            // SAFETY: detection found the features.
            unsafe { scores(&q, &k, dim, 0.5, &mut s, &k) };
            for (h, t) in (0..heads).flat_map(|h| (0..tokens).map(move |t| (h, t))) {
                let want: f64 = (0..dim)
                    .map(|d| value(q[h * dim + d]) * value(k[t * dim + d]))
                    .sum::<f64>()
                    * 0.5;
                let got = s[h * tokens + t] as f64;
                assert!(
                    (got - want).abs() < 1e-4,
                    "score {h},{t} ({heads}x{tokens}x{dim}): {got} {want}"
                );
            }
            let p: Vec<f32> = pseudo(heads * tokens, 4).iter().map(|x| x.abs()).collect();
            let start = pseudo(heads * dim, 5);
            let mut acc = start.clone();
            // Pair order is a permutation: the start values go in and come out unpermuted.
            let mut paired = start.clone();
            for chunk in paired.chunks_exact_mut(PAIR_DIMS) {
                let c: Vec<f32> = chunk.to_vec();
                for l in 0..4 {
                    for i in 0..4 {
                        chunk[4 * l + i] = c[8 * l + i];
                        chunk[16 + 4 * l + i] = c[8 * l + 4 + i];
                    }
                }
            }
            acc.copy_from_slice(&paired);
            unsafe {
                accumulate(&p, &v, dim, &mut acc, &v);
                unpair(&mut acc);
            }
            for (h, d) in (0..heads).flat_map(|h| (0..dim).map(move |d| (h, d))) {
                let want: f64 = start[h * dim + d] as f64
                    + (0..tokens)
                        .map(|t| {
                            let w = half::bf16::from_f32(p[h * tokens + t]).to_f32() as f64;
                            w * value(v[t * dim + d])
                        })
                        .sum::<f64>();
                let got = acc[h * dim + d] as f64;
                assert!(
                    (got - want).abs() < 1e-4,
                    "output {h},{d} ({heads}x{tokens}x{dim}): {got} {want}"
                );
            }
        }
    }
}
