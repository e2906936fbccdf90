//! Top-k selection over per-page scores.
//!
//! Scores are ranked by [`order_key`]: a larger score ranks higher, `-0.0` ranks just below
//! `+0.0`, and every NaN ranks below `-inf` (all NaNs tie with each other). Among equal keys the
//! lower index wins. Results are page indices in ascending order.
//!
//! Both selectors are radix selects over the keys, each digit counted from the top of the current
//! key range. The first digit gives the eight octaves below the maximum score, where the
//! threshold of a typical top-k lies, fine bins (2^-8 octave with 11-bit digits) and the rest of
//! the range coarse ones. One pass then collects the elements above the threshold bin and those
//! in it; only the latter (usually a handful) are refined further.

use std::cell::RefCell;

/// The fine bins of a digit cover the top 2^26 keys of its range: eight octaves.
const WINDOW_BITS: u32 = 26;
/// Threshold bins at most this large are resolved by sorting rather than another digit.
const SMALL: usize = 32;

/// Maps a score to a `u32` whose unsigned order is the ranking order of the scores.
///
/// Distinct non-NaN floats get distinct keys, so `-0.0 < +0.0`. Every NaN maps to 0, below
/// `-inf` (which maps to `0x007f_ffff`).
#[inline]
pub fn order_key(x: f32) -> u32 {
    let bits = x.to_bits();
    let key = bits ^ (((bits as i32 >> 31) as u32) | 0x8000_0000);
    if x.is_nan() { 0 } else { key }
}

/// Reusable buffers for [`topk_exact_with`] and [`topk_approx_with`]; they grow to the largest
/// input seen and are never shrunk.
#[derive(Debug, Default, Clone)]
pub struct TopkScratch {
    keys: Vec<u32>,
    hist: Vec<u32>,
    above: Vec<u32>,
    cand: Vec<u32>,
    work: Vec<u32>,
}

impl TopkScratch {
    pub fn new() -> Self {
        Self::default()
    }
}

thread_local! {
    static SCRATCH: RefCell<TopkScratch> = RefCell::new(TopkScratch::new());
}

fn with_thread_scratch<R>(f: impl FnOnce(&mut TopkScratch) -> R) -> R {
    SCRATCH.with_borrow_mut(f)
}

/// Writes to `out` the indices of the `k` highest-ranked scores, in ascending order; all
/// indices when `k >= scores.len()`. Ties go to the lower index; NaN ranks below `-inf`.
///
/// Uses a per-thread [`TopkScratch`]; see [`topk_exact_with`] to pass one explicitly.
pub fn topk_exact(scores: &[f32], k: usize, out: &mut Vec<u32>) {
    with_thread_scratch(|s| topk_exact_with(s, scores, k, out));
}

/// [`topk_exact`] with caller-owned scratch buffers.
pub fn topk_exact_with(scratch: &mut TopkScratch, scores: &[f32], k: usize, out: &mut Vec<u32>) {
    select(scratch, scores, k, usize::MAX, out);
}

/// Writes to `out` the indices of `k' = min(k, scores.len())` scores, in ascending order, of
/// which at least `ceil((1 - tolerance) * k')` are guaranteed to be in the exact top-k of
/// [`topk_exact`]. Returns the guaranteed fraction (guaranteed members over `k'`), at least
/// `1 - tolerance`; 1.0 when the result is exact, and for `k' == 0`.
///
/// Selection refines the threshold bin only until enough members are guaranteed: all elements
/// above the bin, plus `2 * need - m` when `need` of the bin's `m` elements are taken (any two
/// such subsets of the bin share that many). The `need` are picked by a deterministic strided
/// (Bresenham) walk spread evenly over the bin's members in index order. `tolerance <= 0` (or
/// NaN) gives exactly the result of [`topk_exact`].
///
/// Uses a per-thread [`TopkScratch`]; see [`topk_approx_with`] to pass one explicitly.
pub fn topk_approx(scores: &[f32], k: usize, tolerance: f32, out: &mut Vec<u32>) -> f32 {
    with_thread_scratch(|s| topk_approx_with(s, scores, k, tolerance, out))
}

/// [`topk_approx`] with caller-owned scratch buffers.
pub fn topk_approx_with(
    scratch: &mut TopkScratch,
    scores: &[f32],
    k: usize,
    tolerance: f32,
    out: &mut Vec<u32>,
) -> f32 {
    let k_eff = k.min(scores.len());
    let tolerance = if tolerance > 0.0 {
        tolerance.min(1.0)
    } else {
        0.0
    };
    let required = ((1.0 - f64::from(tolerance)) * k_eff as f64).ceil() as usize;
    match select(scratch, scores, k, required.min(k_eff), out) {
        Some(certain) => certain as f32 / k_eff as f32,
        None => 1.0,
    }
}

/// A bin of one digit: its key range `lo..=hi`, how many keys lie above it and in it.
struct Bin {
    lo: u32,
    hi: u32,
    above: usize,
    count: usize,
}

fn digit_bits(n: usize) -> u32 {
    (usize::BITS - n.leading_zeros()).clamp(8, 11)
}

/// The bins of one digit over keys `lo..=hi`, numbered from the top by the distance
/// `d = hi - key`. With `bits`-bit digits, the top `2^WINDOW_BITS` keys get `2^bits` fine bins
/// of equal width; when the keys span more than that, the rest get up to `2^bits` coarse bins.
#[derive(Clone, Copy, Debug)]
struct Digit {
    hi: u32,
    span: u32,
    /// Largest `d` in a fine bin.
    fine_max: u32,
    fine_shift: u32,
    fine_bins: u32,
    coarse_shift: u32,
    bins: usize,
}

impl Digit {
    fn new(lo: u32, hi: u32, bits: u32) -> Self {
        let span = hi - lo;
        let bit_len = |x: u32| u32::BITS - x.leading_zeros();
        if bit_len(span) <= WINDOW_BITS {
            let fine_shift = bit_len(span).saturating_sub(bits);
            let fine_bins = (span >> fine_shift) + 1;
            return Self {
                hi,
                span,
                fine_max: u32::MAX,
                fine_shift,
                fine_bins,
                coarse_shift: 0,
                bins: fine_bins as usize,
            };
        }
        let fine_max = (1 << WINDOW_BITS) - 1;
        let coarse_span = span - (fine_max + 1);
        let coarse_shift = bit_len(coarse_span).saturating_sub(bits);
        let fine_bins = 1 << bits;
        Self {
            hi,
            span,
            fine_max,
            fine_shift: WINDOW_BITS - bits,
            fine_bins,
            coarse_shift,
            bins: (fine_bins + (coarse_span >> coarse_shift) + 1) as usize,
        }
    }

    #[inline(always)]
    fn bin(&self, key: u32) -> usize {
        let d = self.hi - key;
        if d <= self.fine_max {
            (d >> self.fine_shift) as usize
        } else {
            (self.fine_bins + ((d - self.fine_max - 1) >> self.coarse_shift)) as usize
        }
    }

    /// The keys of bin `b`, as `(lo, hi)`.
    fn keys_of(&self, b: usize) -> (u32, u32) {
        let b = b as u64;
        let (first, width) = if b < u64::from(self.fine_bins) {
            (b << self.fine_shift, 1u64 << self.fine_shift)
        } else {
            let c = b - u64::from(self.fine_bins);
            (
                u64::from(self.fine_max) + 1 + (c << self.coarse_shift),
                1u64 << self.coarse_shift,
            )
        };
        let last = (first + width - 1).min(u64::from(self.span));
        (self.hi - last as u32, self.hi - first as u32)
    }
}

/// Histograms `keys` (all within `lo..=hi`) on the next digit and returns the bin holding the
/// `need`-th largest key.
fn narrow(hist: &mut Vec<u32>, keys: &[u32], lo: u32, hi: u32, need: usize) -> Bin {
    let digit = Digit::new(lo, hi, digit_bits(keys.len()));
    hist.clear();
    hist.resize(digit.bins, 0);
    let (chunks, rest) = keys.as_chunks::<8>();
    count_chunks(chunks, &digit, hist);
    for &key in rest {
        hist[digit.bin(key)] += 1;
    }
    let mut above = 0;
    for (b, &count) in hist.iter().enumerate() {
        let count = count as usize;
        if above + count >= need {
            let (lo, hi) = digit.keys_of(b);
            return Bin {
                lo,
                hi,
                above,
                count,
            };
        }
        above += count;
    }
    unreachable!("fewer than `need` keys");
}

#[cfg(target_arch = "x86_64")]
fn count_chunks(chunks: &[[u32; 8]], digit: &Digit, hist: &mut [u32]) {
    if is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available.
        unsafe { count_chunks_avx2(chunks, digit, hist) }
    } else {
        count_chunks_scalar(chunks, digit, hist)
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn count_chunks(chunks: &[[u32; 8]], digit: &Digit, hist: &mut [u32]) {
    count_chunks_scalar(chunks, digit, hist)
}

fn count_chunks_scalar(chunks: &[[u32; 8]], digit: &Digit, hist: &mut [u32]) {
    for &key in chunks.as_flattened() {
        hist[digit.bin(key)] += 1;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn count_chunks_avx2(chunks: &[[u32; 8]], digit: &Digit, hist: &mut [u32]) {
    use std::arch::x86_64::*;
    let hi = _mm256_set1_epi32(digit.hi as i32);
    let fine_max = _mm256_set1_epi32(digit.fine_max as i32);
    let coarse_start = _mm256_set1_epi32(digit.fine_max.wrapping_add(1) as i32);
    let fine_bins = _mm256_set1_epi32(digit.fine_bins as i32);
    let fine_shift = _mm_cvtsi32_si128(digit.fine_shift as i32);
    let coarse_shift = _mm_cvtsi32_si128(digit.coarse_shift as i32);
    for chunk in chunks {
        let [k0, k1, k2, k3, k4, k5, k6, k7] = chunk.map(|x| x as i32);
        let d = _mm256_sub_epi32(hi, _mm256_setr_epi32(k0, k1, k2, k3, k4, k5, k6, k7));
        let fine = _mm256_srl_epi32(d, fine_shift);
        let coarse = _mm256_add_epi32(
            fine_bins,
            _mm256_srl_epi32(_mm256_sub_epi32(d, coarse_start), coarse_shift),
        );
        let is_fine = _mm256_cmpeq_epi32(_mm256_min_epu32(d, fine_max), d);
        let bins = _mm256_blendv_epi8(coarse, fine, is_fine);
        let (low, high) = (
            _mm256_castsi256_si128(bins),
            _mm256_extracti128_si256::<1>(bins),
        );
        // Two bins per 64-bit extract: fewer extracts than one per lane.
        let pairs = [
            _mm_cvtsi128_si64(low),
            _mm_extract_epi64::<1>(low),
            _mm_cvtsi128_si64(high),
            _mm_extract_epi64::<1>(high),
        ];
        for pair in pairs {
            hist[(pair as u64 & 0xffff_ffff) as usize] += 1;
            hist[(pair as u64 >> 32) as usize] += 1;
        }
    }
}

/// `COMPACT[m]` lists the set bits of `m` in ascending order.
static COMPACT: [[u8; 8]; 256] = {
    let mut table = [[0; 8]; 256];
    let mut m = 0;
    while m < 256 {
        let (mut bit, mut n) = (0, 0);
        while bit < 8 {
            if m & (1 << bit) != 0 {
                table[m][n] = bit as u8;
                n += 1;
            }
            bit += 1;
        }
        m += 1;
    }
    table
};

/// Collects, in index order, the indices of keys above `hi` into `above` (there are `n_above`)
/// and of keys in `lo..=hi` into `cand`.
fn split(
    keys: &[u32],
    lo: u32,
    hi: u32,
    above: &mut Vec<u32>,
    n_above: usize,
    cand: &mut Vec<u32>,
) {
    above.clear();
    above.resize(n_above + 8, 0);
    cand.clear();
    let (chunks, rest) = keys.as_chunks::<8>();
    let mut a = split_chunks(chunks, lo, hi, &mut above[..], cand);
    for (i, &key) in (8 * chunks.len() as u32..).zip(rest) {
        above[a] = i;
        a += usize::from(key > hi);
        if lo <= key && key <= hi {
            cand.push(i);
        }
    }
    debug_assert_eq!(a, n_above);
    above.truncate(n_above);
}

#[cfg(target_arch = "x86_64")]
fn split_chunks(
    chunks: &[[u32; 8]],
    lo: u32,
    hi: u32,
    above: &mut [u32],
    cand: &mut Vec<u32>,
) -> usize {
    if is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available.
        unsafe { split_chunks_avx2(chunks, lo, hi, above, cand) }
    } else {
        split_chunks_scalar(chunks, lo, hi, above, cand)
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn split_chunks(
    chunks: &[[u32; 8]],
    lo: u32,
    hi: u32,
    above: &mut [u32],
    cand: &mut Vec<u32>,
) -> usize {
    split_chunks_scalar(chunks, lo, hi, above, cand)
}

/// Appends the members of chunk `base / 8` given by the bit masks to `above` (whose buffer has
/// 8 spare slots past `a`) and to `cand`; returns the new length of `above`.
#[inline(always)]
fn emit(
    base: u32,
    mask_above: usize,
    mut mask_cand: u32,
    above: &mut [u32],
    a: usize,
    cand: &mut Vec<u32>,
) -> usize {
    let slots: &mut [u32; 8] = (&mut above[a..a + 8]).try_into().unwrap();
    for (slot, &bit) in slots.iter_mut().zip(&COMPACT[mask_above]) {
        *slot = base + u32::from(bit);
    }
    while mask_cand != 0 {
        cand.push(base + mask_cand.trailing_zeros());
        mask_cand &= mask_cand - 1;
    }
    a + mask_above.count_ones() as usize
}

fn split_chunks_scalar(
    chunks: &[[u32; 8]],
    lo: u32,
    hi: u32,
    above: &mut [u32],
    cand: &mut Vec<u32>,
) -> usize {
    let mut a = 0;
    for (base, chunk) in (0..).step_by(8).zip(chunks) {
        let (mut mask_above, mut mask_cand) = (0, 0);
        for (j, &key) in chunk.iter().enumerate() {
            mask_above |= usize::from(key > hi) << j;
            mask_cand |= u32::from(lo <= key && key <= hi) << j;
        }
        a = emit(base, mask_above, mask_cand, above, a, cand);
    }
    a
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn split_chunks_avx2(
    chunks: &[[u32; 8]],
    lo: u32,
    hi: u32,
    above: &mut [u32],
    cand: &mut Vec<u32>,
) -> usize {
    use std::arch::x86_64::*;
    // AVX2 compares signed lanes only: compare the keys with their top bit flipped.
    let hi_v = _mm256_set1_epi32((hi ^ 0x8000_0000) as i32);
    let lo_v = _mm256_set1_epi32((lo ^ 0x8000_0000) as i32);
    let mut a = 0;
    for (base, chunk) in (0..).step_by(8).zip(chunks) {
        let [k0, k1, k2, k3, k4, k5, k6, k7] = chunk.map(|x| (x ^ 0x8000_0000) as i32);
        let keys = _mm256_setr_epi32(k0, k1, k2, k3, k4, k5, k6, k7);
        let above_v = _mm256_cmpgt_epi32(keys, hi_v);
        let outside_v = _mm256_or_si256(above_v, _mm256_cmpgt_epi32(lo_v, keys));
        let mask_above = _mm256_movemask_ps(_mm256_castsi256_ps(above_v)) as usize;
        let mask_cand = !_mm256_movemask_ps(_mm256_castsi256_ps(outside_v)) as u32 & 0xff;
        a = emit(base, mask_above, mask_cand, above, a, cand);
    }
    a
}

/// Merges two disjoint ascending lists, copying the runs of the longer one between elements of
/// the shorter, each found by galloping.
fn merge_sorted(a: &[u32], b: &[u32], out: &mut Vec<u32>) {
    out.clear();
    out.reserve(a.len() + b.len());
    let (long, short) = if a.len() >= b.len() { (a, b) } else { (b, a) };
    let mut rest = long;
    for &x in short {
        let mut end = 1;
        while end < rest.len() && rest[end - 1] < x {
            end *= 2;
        }
        let start = end / 2;
        let end = end.min(rest.len());
        let run = start + rest[start..end].partition_point(|&y| y < x);
        out.extend_from_slice(&rest[..run]);
        out.push(x);
        rest = &rest[run..];
    }
    out.extend_from_slice(rest);
}

/// Selects into `out`. Stops refining once at least `required` of the selected elements are
/// certain members of the exact top-k; returns that count, or `None` when the result is exact.
fn select(
    s: &mut TopkScratch,
    scores: &[f32],
    k: usize,
    required: usize,
    out: &mut Vec<u32>,
) -> Option<usize> {
    let n = scores.len();
    out.clear();
    if k >= n {
        out.extend(0..n as u32);
        return None;
    }
    if k == 0 {
        return None;
    }
    let TopkScratch {
        keys,
        hist,
        above,
        cand,
        work,
    } = s;

    keys.clear();
    keys.resize(n, 0);
    let (mut lo, mut hi) = (u32::MAX, 0);
    for (dst, &x) in keys.iter_mut().zip(scores) {
        let key = order_key(x);
        *dst = key;
        lo = lo.min(key);
        hi = hi.max(key);
    }
    let keys = &keys[..];

    let first = narrow(hist, keys, lo, hi, k);
    let (mut lo, mut hi, mut m) = (first.lo, first.hi, first.count);
    let mut certain = first.above;
    let mut need = k - certain;
    split(keys, lo, hi, above, certain, cand);

    work.clear();
    work.extend(cand.iter().map(|&i| keys[i as usize]));
    let exact = loop {
        if need == m || lo == hi {
            break true;
        }
        if certain + (2 * need).saturating_sub(m) >= required {
            break false;
        }
        if work.len() <= SMALL {
            work.sort_unstable_by(|a, b| b.cmp(a));
            let t = work[need - 1];
            let gt = work.partition_point(|&x| x > t);
            m = work.partition_point(|&x| x >= t) - gt;
            certain += gt;
            need -= gt;
            (lo, hi) = (t, t);
            break true;
        }
        let bin = narrow(hist, work, lo, hi, need);
        certain += bin.above;
        need -= bin.above;
        (lo, hi, m) = (bin.lo, bin.hi, bin.count);
        work.retain(|&x| lo <= x && x <= hi);
    };

    // The threshold bin's `m` members are in `cand`, in index order: all of `cand` above the bin
    // is taken, and `need` of the bin.
    work.clear();
    let mut taken = 0;
    let mut acc = m / 2;
    for &i in cand.iter() {
        let key = keys[i as usize];
        if key > hi {
            work.push(i);
        } else if key >= lo {
            if exact {
                if taken < need {
                    work.push(i);
                    taken += 1;
                }
            } else {
                acc += need;
                if acc >= m {
                    acc -= m;
                    work.push(i);
                }
            }
        }
    }
    merge_sorted(above, work, out);
    debug_assert_eq!(out.len(), k);
    if exact {
        None
    } else {
        Some(certain + (2 * need).saturating_sub(m))
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    fn keys(n: usize, seed: u32) -> Vec<u32> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x
            })
            .collect()
    }

    #[test]
    fn avx2_kernels_match_scalar() {
        if !is_x86_feature_detected!("avx2") {
            return;
        }
        let keys = keys(8 * 300, 12345);
        let (chunks, _) = keys.as_chunks::<8>();
        for (lo, hi, bits) in [
            (0, u32::MAX, 11),
            (0x4000_0000, 0xc000_0000, 11),
            (0x3000_0000, 0x3400_0000, 11),
            (5, 0x0010_0000, 8),
            (9, 9, 8),
        ] {
            let digit = Digit::new(lo, hi, bits);
            let (mut simd, mut scalar) = (vec![0; digit.bins], vec![0; digit.bins]);
            let chunks: Vec<[u32; 8]> = chunks.iter().map(|c| c.map(|k| k.clamp(lo, hi))).collect();
            // SAFETY: AVX2 was detected above.
            unsafe { count_chunks_avx2(&chunks, &digit, &mut simd) };
            count_chunks_scalar(&chunks, &digit, &mut scalar);
            assert_eq!(simd, scalar);
            assert_eq!(scalar.iter().sum::<u32>() as usize, 8 * chunks.len());
            for (b, &count) in scalar.iter().enumerate() {
                let (bin_lo, bin_hi) = digit.keys_of(b);
                let inside = chunks
                    .as_flattened()
                    .iter()
                    .filter(|&&k| bin_lo <= k && k <= bin_hi);
                assert_eq!(inside.count(), count as usize, "{digit:?} bin {b}");
            }
        }
        for (lo, hi) in [
            (0, 0),
            (0x4000_0000, 0x8000_0000),
            (0x9000_0000, 0x9fff_ffff),
            (7, u32::MAX),
        ] {
            let mut bufs = [
                (vec![0; keys.len() + 8], Vec::new()),
                (vec![0; keys.len() + 8], Vec::new()),
            ];
            let [(a0, c0), (a1, c1)] = &mut bufs;
            // SAFETY: AVX2 was detected above.
            let n0 = unsafe { split_chunks_avx2(chunks, lo, hi, a0, c0) };
            let n1 = split_chunks_scalar(chunks, lo, hi, a1, c1);
            assert_eq!((&a0[..n0], &*c0), (&a1[..n1], &*c1));
        }
    }
}
