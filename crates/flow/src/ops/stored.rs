//! Products with page summaries read in their stored dtype (f32, f16, bf16 or fp8), widened in
//! registers: the page-field reads of the index phase that skip a tile of f32 copies.

/// `out[m, n] = a[m, k] · bᵀ` with `b` (`[n, k]`) in its stored dtype, converted in registers.
pub fn dot_stored<T: Widen>(a: &[f32], m: usize, b: &[T], out: &mut [f32]) {
    let k = a.len() / m;
    let n = b.len() / k;
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    if k.is_multiple_of(8) && k <= 8 * EIGHT_ROWS_CHUNKS && n.is_multiple_of(8) {
        for jb in (0..n).step_by(8) {
            let (b, out) = (&b[jb * k..(jb + 8) * k], &mut out[jb..]);
            // SAFETY: the build targets AVX2 and FMA (checked by cfg); the shapes are as
            // `dot_eight_rows` requires.
            unsafe {
                match k / 8 {
                    1 => dot_eight_rows::<T, 1>(a, m, b, n, out),
                    2 => dot_eight_rows::<T, 2>(a, m, b, n, out),
                    3 => dot_eight_rows::<T, 3>(a, m, b, n, out),
                    _ => dot_eight_rows::<T, 4>(a, m, b, n, out),
                }
            };
        }
        return;
    }
    for j in 0..n {
        let br = &b[j * k..(j + 1) * k];
        let mut i = 0;
        while i < m {
            let rows = &a[i * k..];
            let (d, r): ([f32; 4], usize) = match m - i {
                1 => (pad(T::dot_rows::<1>(rows, br)), 1),
                2 => (pad(T::dot_rows::<2>(rows, br)), 2),
                3 => (pad(T::dot_rows::<3>(rows, br)), 3),
                _ => (T::dot_rows::<4>(rows, br), 4),
            };
            for (x, v) in d.into_iter().take(r).enumerate() {
                out[(i + x) * n + j] = v;
            }
            i += r;
        }
    }
}

/// Most eight-value chunks per row that [`dot_eight_rows`] keeps widened in registers.
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
const EIGHT_ROWS_CHUNKS: usize = 4;

/// `out[i * n + u] = a[i] · b[u]` for the `m` rows of `a` (`[m, k]`) and the eight stored rows
/// of `b` (`[8, k]`). Each row of `b` is widened once for all rows of `a`, and the eight dot
/// products of a row of `a` are reduced together into one vector: short rows (Double
/// Sparsity's 16 channels) would otherwise spend more on reductions than on products.
///
/// # Safety
/// The CPU must support AVX2 and FMA; `k` must be `8 * C` with `C` at most
/// `EIGHT_ROWS_CHUNKS`, `b.len() == 8 * k`, and `out` must hold `(m - 1) * n + 8` values.
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
#[inline(always)]
unsafe fn dot_eight_rows<T: Widen, const C: usize>(
    a: &[f32],
    m: usize,
    b: &[T],
    n: usize,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let k = 8 * C;
    assert!(C <= EIGHT_ROWS_CHUNKS && b.len() == 8 * k);
    assert!(a.len() >= m * k && out.len() + n >= m * n + 8);
    // SAFETY: every offset below stays inside the row it names (asserted above).
    unsafe {
        let wide: [[__m256; C]; 8] = std::array::from_fn(|u| {
            std::array::from_fn(|c| T::load8(b.as_ptr().add(u * k + c * 8)))
        });
        for i in 0..m {
            let mut acc = [_mm256_setzero_ps(); 8];
            for c in 0..C {
                let x = _mm256_loadu_ps(a.as_ptr().add(i * k + c * 8));
                for (acc, row) in acc.iter_mut().zip(&wide) {
                    *acc = _mm256_fmadd_ps(x, row[c], *acc);
                }
            }
            // Lane u of the result sums acc[u].
            let h01 = _mm256_hadd_ps(acc[0], acc[1]);
            let h23 = _mm256_hadd_ps(acc[2], acc[3]);
            let h45 = _mm256_hadd_ps(acc[4], acc[5]);
            let h67 = _mm256_hadd_ps(acc[6], acc[7]);
            let (lo, hi) = (_mm256_hadd_ps(h01, h23), _mm256_hadd_ps(h45, h67));
            let sums = _mm256_add_ps(
                _mm256_permute2f128_ps::<0x20>(lo, hi),
                _mm256_permute2f128_ps::<0x31>(lo, hi),
            );
            _mm256_storeu_ps(out.as_mut_ptr().add(i * n), sums);
        }
    }
}

fn pad<const R: usize>(x: [f32; R]) -> [f32; 4] {
    std::array::from_fn(|i| if i < R { x[i] } else { 0.0 })
}

/// `R` rows of `a` (`[R, k]`, `R <= 4`) dotted with two stored rows `b0` and `b1` (two pages'
/// summaries) at once, sharing each load of `a`.
#[inline]
pub fn dot_pair<const R: usize, T: Widen>(a: &[f32], b0: &[T], b1: &[T]) -> [[f32; R]; 2] {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    {
        // SAFETY: the build targets AVX2 and FMA (checked by cfg).
        unsafe { dot_pair_wide::<R, T>(a, b0, b1) }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    )))]
    {
        [T::dot_rows::<R>(a, b0), T::dot_rows::<R>(a, b1)]
    }
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
#[inline(always)]
unsafe fn dot_pair_wide<const R: usize, T: Widen>(a: &[f32], b0: &[T], b1: &[T]) -> [[f32; R]; 2] {
    use std::arch::x86_64::*;
    let k = b0.len();
    assert!(R <= 4 && b1.len() == k);
    let rows: [&[f32]; R] = std::array::from_fn(|r| &a[r * k..(r + 1) * k]);
    let chunks = k / 8;
    // Raw widening scales every product by the same power of two, so the sums scale back bit
    // for bit while they stay in f32's normal range (queries far below 2^-100 or above 2^100
    // would leave it).
    let raw = T::RAW_SCALE != 1.0 && T::raw_ok(&b0[..chunks * 8]) && T::raw_ok(&b1[..chunks * 8]);
    // SAFETY: offsets `c * 8 .. c * 8 + 8` are within every row, `b0` and `b1` for `c < chunks`.
    unsafe {
        let load = |p: *const T| if raw { T::load8_raw(p) } else { T::load8(p) };
        let mut acc0 = [_mm256_setzero_ps(); 4];
        let mut acc1 = [_mm256_setzero_ps(); 4];
        for c in 0..chunks {
            let u = load(b0.as_ptr().add(c * 8));
            let w = load(b1.as_ptr().add(c * 8));
            for r in 0..R {
                let x = _mm256_loadu_ps(rows[r].as_ptr().add(c * 8));
                acc0[r] = _mm256_fmadd_ps(x, u, acc0[r]);
                acc1[r] = _mm256_fmadd_ps(x, w, acc1[r]);
            }
        }
        // One horizontal reduction for four accumulators (unused ones are zero).
        let scale = if raw { T::RAW_SCALE } else { 1.0 };
        let reduce = |s: [__m256; 4]| {
            let h = _mm256_hadd_ps(_mm256_hadd_ps(s[0], s[1]), _mm256_hadd_ps(s[2], s[3]));
            let q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
            let mut out = [0f32; 4];
            _mm_storeu_ps(out.as_mut_ptr(), _mm_mul_ps(q, _mm_set1_ps(scale)));
            out
        };
        let (s0, s1) = (reduce(acc0), reduce(acc1));
        let tail = |r: usize, b: &[T]| {
            (chunks * 8..k)
                .map(|o| rows[r][o] * b[o].widen())
                .sum::<f32>()
        };
        [
            std::array::from_fn(|r| s0[r] + tail(r, b0)),
            std::array::from_fn(|r| s1[r] + tail(r, b1)),
        ]
    }
}

/// `out[r] = sum over c of max(a[r, c] * hi[c], a[r, c] * lo[c])` for the rows of `a`
/// (`[out.len(), k]`), with `hi` and `lo` (`k` values each) in their stored dtype.
#[inline]
pub fn envelope_rows<T: Widen>(a: &[f32], hi: &[T], lo: &[T], out: &mut [f32]) {
    let k = hi.len();
    assert!(lo.len() == k && a.len() == out.len() * k);
    let mut r = 0;
    while r < out.len() {
        let rows = &a[r * k..];
        let o = &mut out[r..];
        // Each arm writes a fixed number of rows, so the copy is a few moves, not a call.
        r += match o.len() {
            1 => write_rows(o, envelope_block::<1, T>(rows, hi, lo)),
            2 => write_rows(o, envelope_block::<2, T>(rows, hi, lo)),
            3 => write_rows(o, envelope_block::<3, T>(rows, hi, lo)),
            _ => write_rows(o, envelope_block::<4, T>(rows, hi, lo)),
        };
    }
}

/// Writes `x` to the first `R` values of `o`; returns `R`.
#[inline(always)]
fn write_rows<const R: usize>(o: &mut [f32], x: [f32; R]) -> usize {
    o[..R].copy_from_slice(&x);
    R
}

/// [`envelope_rows`] for the first `R` rows of `a`, sharing each load of `hi` and `lo`.
fn envelope_block<const R: usize, T: Widen>(a: &[f32], hi: &[T], lo: &[T]) -> [f32; R] {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    {
        // SAFETY: the build targets AVX2 (checked by cfg).
        unsafe { envelope_block_wide::<R, T>(a, hi, lo) }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    )))]
    {
        let k = hi.len();
        std::array::from_fn(|r| (0..k).map(|c| envelope_term(a, hi, lo, r, c)).sum())
    }
}

#[inline(always)]
fn envelope_term<T: Widen>(a: &[f32], hi: &[T], lo: &[T], r: usize, c: usize) -> f32 {
    let x = a[r * hi.len() + c];
    f32::max(x * hi[c].widen(), x * lo[c].widen())
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
#[inline(always)]
unsafe fn envelope_block_wide<const R: usize, T: Widen>(a: &[f32], hi: &[T], lo: &[T]) -> [f32; R] {
    use std::arch::x86_64::*;
    let k = hi.len();
    assert!(lo.len() == k && a.len() >= R * k);
    let chunks = k / 8;
    // As in `dot_pair_wide`: a positive power of two scales both products alike, so their
    // maximum and the sums scale back bit for bit.
    let raw = T::RAW_SCALE != 1.0 && T::raw_ok(&hi[..chunks * 8]) && T::raw_ok(&lo[..chunks * 8]);
    // SAFETY: offsets `c * 8 .. c * 8 + 8` are within `hi`, `lo` and each of the `R` rows of
    // `a` for `c < chunks` (asserted above).
    unsafe {
        let load = |p: *const T| if raw { T::load8_raw(p) } else { T::load8(p) };
        let scale = if raw { T::RAW_SCALE } else { 1.0 };
        let mut acc = [_mm256_setzero_ps(); R];
        for c in 0..chunks {
            let h = load(hi.as_ptr().add(c * 8));
            let l = load(lo.as_ptr().add(c * 8));
            // The larger of x * h and x * l is x times the larger of h and l where x >= 0, and
            // times the smaller where x < 0 (the sign bit picks): one product a value. It
            // differs only where x = 0 meets an infinite h or l (NaN, as on the GPU).
            let (big, small) = (_mm256_max_ps(h, l), _mm256_min_ps(h, l));
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = _mm256_loadu_ps(a.as_ptr().add(r * k + c * 8));
                *acc = _mm256_fmadd_ps(x, _mm256_blendv_ps(big, small, x), *acc);
            }
        }
        let mut out = [0f32; R];
        for (r, (out, acc)) in out.iter_mut().zip(acc).enumerate() {
            let q = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
            let q = _mm_add_ps(q, _mm_movehl_ps(q, q));
            let q = _mm_add_ss(q, _mm_movehdup_ps(q));
            *out = _mm_cvtss_f32(q) * scale;
            for c in chunks * 8..k {
                *out += envelope_term(a, hi, lo, r, c);
            }
        }
        out
    }
}

/// A stored element that widens to f32; `dot4` dots four f32 rows with a row of stored values.
pub trait Widen: Copy {
    fn widen(self) -> f32;
    /// What `load8_raw` leaves out (a power of two): it widens to the values
    /// divided by this, in fewer instructions.
    const RAW_SCALE: f32 = 1.0;
    /// Whether `load8_raw` reads every one of `values` right (fp8: no NaN).
    fn raw_ok(_values: &[Self]) -> bool {
        true
    }
    /// Eight values from `p` as f32 lanes.
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    /// # Safety
    /// `p` must point to eight readable values.
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
    /// Eight values from `p` divided by [`RAW_SCALE`](Self::RAW_SCALE), as f32 lanes.
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    /// # Safety
    /// As [`load8`](Self::load8).
    unsafe fn load8_raw(p: *const Self) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller's guarantee.
        unsafe { Self::load8(p) }
    }

    /// The first `R` rows of `a` (`[R, k]`, `k = b.len()`) dotted with `b`.
    fn dot_rows<const R: usize>(a: &[f32], b: &[Self]) -> [f32; R] {
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma"
        ))]
        {
            // SAFETY: the build targets AVX2 and FMA (checked by cfg).
            unsafe { dot_rows_wide::<R, Self>(a, b) }
        }
        #[cfg(not(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma"
        )))]
        {
            let k = b.len();
            std::array::from_fn(|r| {
                a[r * k..(r + 1) * k]
                    .iter()
                    .zip(b)
                    .map(|(x, y)| x * y.widen())
                    .sum()
            })
        }
    }
}

impl Widen for f32 {
    fn widen(self) -> f32 {
        self
    }
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller guarantees eight readable values.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }
}

impl Widen for half::f16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: x86-64-v3 includes F16C; the caller guarantees eight readable values.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
}

impl Widen for vortex_kv::F8E4M3 {
    fn widen(self) -> f32 {
        vortex_kv::KvElem::to_f32(self)
    }
    const RAW_SCALE: f32 = vortex_kernels::simd::FP8_RAW_FACTOR;
    fn raw_ok(values: &[Self]) -> bool {
        vortex_kernels::simd::raw_fp8(values)
    }
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller guarantees eight readable values; x86-64-v3 includes F16C.
        unsafe { vortex_kernels::simd::fp8x8_to_f32(p) }
    }
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    unsafe fn load8_raw(p: *const Self) -> std::arch::x86_64::__m256 {
        // SAFETY: as `load8`.
        unsafe { vortex_kernels::simd::fp8x8_to_f32_raw(p) }
    }
}

impl Widen for half::bf16 {
    fn widen(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller guarantees eight readable values; a bf16 is an f32's high half.
        unsafe {
            let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
        }
    }
}

/// `R` f32 rows of `a` dotted with `b`, widened eight values at a time, two chains of FMAs per
/// row, and one horizontal reduction for all rows.
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
#[inline(always)]
unsafe fn dot_rows_wide<const R: usize, T: Widen>(a: &[f32], b: &[T]) -> [f32; R] {
    use std::arch::x86_64::*;
    let k = b.len();
    let rows: [&[f32]; R] = std::array::from_fn(|r| &a[r * k..(r + 1) * k]);
    let chunks = k / 8;
    // SAFETY: offsets `c * 8 .. c * 8 + 8` are within every row and `b` for `c < chunks`.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); R];
        let mut acc2 = [_mm256_setzero_ps(); R];
        let mut c = 0;
        while c + 2 <= chunks {
            let bv = T::load8(b.as_ptr().add(c * 8));
            let bw = T::load8(b.as_ptr().add(c * 8 + 8));
            for r in 0..R {
                let p = rows[r].as_ptr().add(c * 8);
                acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(p), bv, acc[r]);
                acc2[r] = _mm256_fmadd_ps(_mm256_loadu_ps(p.add(8)), bw, acc2[r]);
            }
            c += 2;
        }
        if c < chunks {
            let bv = T::load8(b.as_ptr().add(c * 8));
            for r in 0..R {
                acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(rows[r].as_ptr().add(c * 8)), bv, acc[r]);
            }
        }
        let mut sums = [0f32; 4];
        if R == 4 {
            let s: [__m256; 4] = std::array::from_fn(|r| _mm256_add_ps(acc[r], acc2[r]));
            let h = _mm256_hadd_ps(_mm256_hadd_ps(s[0], s[1]), _mm256_hadd_ps(s[2], s[3]));
            let q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
            _mm_storeu_ps(sums.as_mut_ptr(), q);
        } else {
            for r in 0..R {
                let v = _mm256_add_ps(acc[r], acc2[r]);
                let q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                let q = _mm_add_ps(q, _mm_movehl_ps(q, q));
                let q = _mm_add_ss(q, _mm_movehdup_ps(q));
                sums[r] = _mm_cvtss_f32(q);
            }
        }
        std::array::from_fn(|r| {
            sums[r]
                + (chunks * 8..k)
                    .map(|o| rows[r][o] * b[o].widen())
                    .sum::<f32>()
        })
    }
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};

    use super::*;

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.0 - 1.0)
            .collect()
    }

    /// [`values`] scaled into e4m3's range and rounded to it.
    fn fp8_values(n: usize, seed: usize) -> Vec<vortex_kv::F8E4M3> {
        use vortex_kv::KvElem;
        values(n, seed)
            .into_iter()
            .map(|x| vortex_kv::F8E4M3::from_f32(x * 300.0))
            .collect()
    }

    /// The same bytes, widened only exactly.
    fn exact(b: &[vortex_kv::F8E4M3]) -> Vec<Exact> {
        b.iter().map(|&x| Exact(x)).collect()
    }

    /// `dot_stored` against a plain f64 product, over shapes that take the eight-row path
    /// (k a multiple of 8 up to 32, n a multiple of 8) and shapes that do not.
    fn check_dot_stored<T: Widen>(from: fn(f32) -> T) {
        for (m, n, k) in [
            (4, 16, 16),
            (1, 8, 8),
            (6, 24, 32),
            (3, 8, 24),
            (4, 16, 40),
            (2, 13, 16),
            (5, 7, 12),
        ] {
            let a = values(m * k, 1);
            let b: Vec<T> = values(n * k, 2).into_iter().map(from).collect();
            let mut out = vec![f32::NAN; m * n];
            dot_stored(&a, m, &b, &mut out);
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..k)
                        .map(|c| a[i * k + c] as f64 * b[j * k + c].widen() as f64)
                        .sum();
                    let got = out[i * n + j] as f64;
                    assert!((got - want).abs() < 1e-5, "m={m} n={n} k={k} ({i}, {j})");
                }
            }
        }
    }

    #[test]
    fn dot_stored_matches_a_plain_product() {
        check_dot_stored::<f32>(|x| x);
        check_dot_stored::<f16>(f16::from_f32);
        check_dot_stored::<bf16>(bf16::from_f32);
        check_dot_stored::<vortex_kv::F8E4M3>(vortex_kv::KvElem::from_f32);
    }

    /// fp8 widened only exactly (no raw widening).
    #[derive(Clone, Copy)]
    #[repr(transparent)]
    struct Exact(vortex_kv::F8E4M3);

    impl Widen for Exact {
        fn widen(self) -> f32 {
            self.0.widen()
        }
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma"
        ))]
        unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
            // SAFETY: `Exact` is an fp8 byte; the caller's guarantee.
            unsafe { Widen::load8(p.cast::<vortex_kv::F8E4M3>()) }
        }
    }

    /// Pairs of fp8 pages: widened raw (scaled) when neither holds a NaN byte, exactly
    /// otherwise; the same products either way, and a NaN byte gives NaN.
    #[test]
    fn fp8_page_pairs_dot_like_their_values() {
        use vortex_kv::F8E4M3;
        let k = 128;
        let a = values(4 * k, 6);
        let (b0, mut b1) = (fp8_values(k, 7), fp8_values(k, 8));
        let want = |b: &[F8E4M3], r: usize| -> f64 {
            (0..k)
                .map(|c| a[r * k + c] as f64 * b[c].widen() as f64)
                .sum()
        };
        let near = |got: f32, b: &[F8E4M3], r: usize| (got as f64 - want(b, r)).abs() < 1e-2;
        let [g0, g1] = dot_pair::<4, F8E4M3>(&a, &b0, &b1);
        for (r, (x, y)) in g0.iter().zip(&g1).enumerate() {
            assert!(near(*x, &b0, r) && near(*y, &b1, r), "row {r}");
        }
        // The same pages through the exact widening, in the same order: the same bits.
        assert_eq!([g0, g1], dot_pair::<4, Exact>(&a, &exact(&b0), &exact(&b1)));
        b1[37] = F8E4M3(0x7f);
        let [g0, g1] = dot_pair::<4, F8E4M3>(&a, &b0, &b1);
        for (r, (x, y)) in g0.iter().zip(&g1).enumerate() {
            assert!(near(*x, &b0, r) && y.is_nan(), "row {r}: {y}");
        }
    }

    /// fp8 envelopes widened raw give the bits of the exact widening, and their values.
    #[test]
    fn fp8_envelopes_bound_like_their_values() {
        for k in [128, 36] {
            let a = values(4 * k, 9);
            let (hi, lo) = (fp8_values(k, 10), fp8_values(k, 11));
            let mut got = [0f32; 4];
            envelope_rows(&a, &hi, &lo, &mut got);
            for (r, &g) in got.iter().enumerate() {
                let want: f64 = (0..k)
                    .map(|c| {
                        let x = a[r * k + c] as f64;
                        (x * hi[c].widen() as f64).max(x * lo[c].widen() as f64)
                    })
                    .sum();
                assert!(
                    (g as f64 - want).abs() < 1e-2,
                    "k={k} row {r}: {g} vs {want}"
                );
            }
            let mut want = [0f32; 4];
            envelope_rows(&a, &exact(&hi), &exact(&lo), &mut want);
            assert_eq!(got, want, "k={k}");
        }
    }

    /// Every fp8 byte widens eight at a time to its value, the NaN bytes to NaN.
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    #[test]
    fn fp8_widens_to_its_values() {
        let bytes: Vec<vortex_kv::F8E4M3> = (0..=255u8).map(vortex_kv::F8E4M3).collect();
        for chunk in bytes.chunks(8) {
            let mut got = [0f32; 8];
            // SAFETY: eight bytes; the build targets AVX2, FMA and F16C (x86-64-v3).
            unsafe {
                std::arch::x86_64::_mm256_storeu_ps(got.as_mut_ptr(), Widen::load8(chunk.as_ptr()))
            };
            for (b, g) in chunk.iter().zip(got) {
                let want = b.widen();
                assert!(
                    g == want || (g.is_nan() && want.is_nan()),
                    "{:#04x}: {g} vs {want}",
                    b.0
                );
            }
        }
    }

    #[test]
    fn envelope_rows_match_their_definition() {
        for (m, k) in [(4, 128), (1, 8), (6, 36), (3, 5)] {
            let a = values(m * k, 3);
            let hi: Vec<bf16> = values(k, 4).into_iter().map(bf16::from_f32).collect();
            let lo: Vec<bf16> = values(k, 5).into_iter().map(bf16::from_f32).collect();
            let mut out = vec![f32::NAN; m];
            envelope_rows(&a, &hi, &lo, &mut out);
            for (r, &got) in out.iter().enumerate() {
                let want: f64 = (0..k)
                    .map(|c| {
                        let x = a[r * k + c] as f64;
                        (x * hi[c].to_f64()).max(x * lo[c].to_f64())
                    })
                    .sum();
                assert!((got as f64 - want).abs() < 1e-4, "m={m} k={k} row {r}");
            }
        }
    }
}
