//! Operator kernels on blocks of pages. A [`View`] is `count` consecutive `[rows, cols]` blocks
//! (one per page) or a single block broadcast to every page.

use crate::ir::{Axis, BinaryOp, ReduceOp, UnaryOp};

#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    pub data: &'a [f32],
    pub per_page: bool,
    pub rows: usize,
    pub cols: usize,
}

impl<'a> View<'a> {
    #[inline]
    pub fn block(&self, t: usize) -> &'a [f32] {
        let e = self.rows * self.cols;
        if self.per_page {
            &self.data[t * e..(t + 1) * e]
        } else {
            &self.data[..e]
        }
    }
}

/// Output blocks: `count` blocks of `rows x cols`.
pub struct Out<'a> {
    pub data: &'a mut [f32],
    pub rows: usize,
    pub cols: usize,
}

impl Out<'_> {
    #[inline]
    fn block(&mut self, t: usize) -> &mut [f32] {
        let e = self.rows * self.cols;
        &mut self.data[t * e..(t + 1) * e]
    }
}

/// A dot product the compiler vectorises: sixteen independent partial sums.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0.0;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    acc.iter().sum::<f32>() + tail
}

pub fn unary(op: UnaryOp, a: View, count: usize, out: &mut Out) {
    match op {
        UnaryOp::Neg => map(a, count, out, |x| -x),
        UnaryOp::Abs => map(a, count, out, f32::abs),
        UnaryOp::Exp => map(a, count, out, f32::exp),
        UnaryOp::Log => map(a, count, out, f32::ln),
        UnaryOp::Sqrt => map(a, count, out, f32::sqrt),
        UnaryOp::Relu => map(a, count, out, |x| x.max(0.0)),
        UnaryOp::Sigmoid => map(a, count, out, |x| 1.0 / (1.0 + (-x).exp())),
        UnaryOp::Silu => map(a, count, out, |x| x / (1.0 + (-x).exp())),
        UnaryOp::Sign => map(a, count, out, |x| {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            }
        }),
        UnaryOp::Floor => map(a, count, out, f32::floor),
    }
}

fn map(a: View, count: usize, out: &mut Out, f: impl Fn(f32) -> f32) {
    let n = count * out.rows * out.cols;
    if a.per_page {
        for (o, &x) in out.data[..n].iter_mut().zip(&a.data[..n]) {
            *o = f(x);
        }
        return;
    }
    for t in 0..count {
        let src = a.block(t);
        for (o, &x) in out.block(t).iter_mut().zip(src) {
            *o = f(x);
        }
    }
}

pub fn binary(op: BinaryOp, a: View, b: View, count: usize, out: &mut Out) {
    let flag = |c: bool| if c { 1.0 } else { 0.0 };
    match op {
        BinaryOp::Add => zip(a, b, count, out, |x, y| x + y),
        BinaryOp::Sub => zip(a, b, count, out, |x, y| x - y),
        BinaryOp::Mul => zip(a, b, count, out, |x, y| x * y),
        BinaryOp::Div => zip(a, b, count, out, |x, y| x / y),
        BinaryOp::Max => zip(a, b, count, out, f32::max),
        BinaryOp::Min => zip(a, b, count, out, f32::min),
        BinaryOp::Gt => zip(a, b, count, out, |x, y| flag(x > y)),
        BinaryOp::Ge => zip(a, b, count, out, |x, y| flag(x >= y)),
        BinaryOp::Lt => zip(a, b, count, out, |x, y| flag(x < y)),
        BinaryOp::Le => zip(a, b, count, out, |x, y| flag(x <= y)),
        BinaryOp::Eq => zip(a, b, count, out, |x, y| flag(x == y)),
        BinaryOp::Ne => zip(a, b, count, out, |x, y| flag(x != y)),
        BinaryOp::Mod => zip(a, b, count, out, |x, y| x - y * (x / y).floor()),
    }
}

/// Elementwise with broadcasting of rows and columns of size 1.
fn zip(a: View, b: View, count: usize, out: &mut Out, f: impl Fn(f32, f32) -> f32 + Copy) {
    let (rows, cols) = (out.rows, out.cols);
    let n = count * rows * cols;
    let full = |v: &View| v.per_page && v.rows == rows && v.cols == cols;
    let scalar = |v: &View| !v.per_page && v.rows == 1 && v.cols == 1;
    // Whole tiles at once where no broadcasting within a page is needed.
    if full(&a) && full(&b) {
        let o = &mut out.data[..n];
        o.iter_mut()
            .zip(a.data[..n].iter().zip(&b.data[..n]))
            .for_each(|(o, (&x, &y))| *o = f(x, y));
        return;
    }
    if full(&a) && scalar(&b) {
        let y = b.data[0];
        out.data[..n]
            .iter_mut()
            .zip(&a.data[..n])
            .for_each(|(o, &x)| *o = f(x, y));
        return;
    }
    if scalar(&a) && full(&b) {
        let x = a.data[0];
        out.data[..n]
            .iter_mut()
            .zip(&b.data[..n])
            .for_each(|(o, &y)| *o = f(x, y));
        return;
    }
    for t in 0..count {
        let (ab, bb) = (a.block(t), b.block(t));
        let ob = out.block(t);
        for r in 0..rows {
            let ar = &ab[if a.rows == 1 { 0 } else { r * a.cols }..][..a.cols];
            let br = &bb[if b.rows == 1 { 0 } else { r * b.cols }..][..b.cols];
            let or = &mut ob[r * cols..(r + 1) * cols];
            match (a.cols == cols, b.cols == cols) {
                (true, true) => or
                    .iter_mut()
                    .zip(ar.iter().zip(br))
                    .for_each(|(o, (&x, &y))| *o = f(x, y)),
                (true, false) => or.iter_mut().zip(ar).for_each(|(o, &x)| *o = f(x, br[0])),
                (false, true) => or.iter_mut().zip(br).for_each(|(o, &y)| *o = f(ar[0], y)),
                (false, false) => or.iter_mut().for_each(|o| *o = f(ar[0], br[0])),
            }
        }
    }
}

pub fn select(c: View, a: View, b: View, count: usize, out: &mut Out) {
    let (rows, cols) = (out.rows, out.cols);
    let at = |v: &View, blk: &[f32], r: usize, k: usize| {
        blk[if v.rows == 1 { 0 } else { r * v.cols } + if v.cols == 1 { 0 } else { k }]
    };
    for t in 0..count {
        let (cb, ab, bb) = (c.block(t), a.block(t), b.block(t));
        let ob = out.block(t);
        for r in 0..rows {
            for k in 0..cols {
                ob[r * cols + k] = if at(&c, cb, r, k) != 0.0 {
                    at(&a, ab, r, k)
                } else {
                    at(&b, bb, r, k)
                };
            }
        }
    }
}

pub fn reduce(op: ReduceOp, axis: Axis, a: View, count: usize, out: &mut Out) {
    let (rows, cols) = (a.rows, a.cols);
    if a.per_page && ((axis == Axis::Rows && cols == 1) || (axis == Axis::Cols && rows == 1)) {
        // One value per page from a column or row of `n` values: a plain loop over the tile.
        let n = rows * cols;
        for (d, src) in out.data[..count].iter_mut().zip(a.data.chunks_exact(n)) {
            *d = fold_row(op, src);
        }
        return;
    }
    for t in 0..count {
        let src = a.block(t);
        let dst = out.block(t);
        match axis {
            Axis::Rows => {
                let first = &src[..cols];
                match op {
                    ReduceOp::Max | ReduceOp::Min | ReduceOp::Sum | ReduceOp::Mean => {
                        dst.copy_from_slice(first);
                        for r in 1..rows {
                            let row = &src[r * cols..(r + 1) * cols];
                            match op {
                                ReduceOp::Max => {
                                    dst.iter_mut().zip(row).for_each(|(d, &x)| *d = d.max(x))
                                }
                                ReduceOp::Min => {
                                    dst.iter_mut().zip(row).for_each(|(d, &x)| *d = d.min(x))
                                }
                                _ => dst.iter_mut().zip(row).for_each(|(d, &x)| *d += x),
                            }
                        }
                        if op == ReduceOp::Mean {
                            dst.iter_mut().for_each(|d| *d /= rows as f32);
                        }
                    }
                    ReduceOp::L2Norm => {
                        for k in 0..cols {
                            dst[k] = fold(op, (0..rows).map(|r| src[r * cols + k]), rows);
                        }
                    }
                }
            }
            Axis::Cols => {
                for r in 0..rows {
                    dst[r] = fold_row(op, &src[r * cols..(r + 1) * cols]);
                }
            }
            Axis::Pages => unreachable!("page reductions are barriers"),
        }
    }
}

fn fold(op: ReduceOp, xs: impl Iterator<Item = f32>, n: usize) -> f32 {
    match op {
        ReduceOp::Sum => xs.sum(),
        ReduceOp::Mean => xs.sum::<f32>() / n as f32,
        ReduceOp::Max => xs.fold(f32::NEG_INFINITY, f32::max),
        ReduceOp::Min => xs.fold(f32::INFINITY, f32::min),
        ReduceOp::L2Norm => xs.map(|x| x * x).sum::<f32>().sqrt(),
    }
}

fn fold_row(op: ReduceOp, row: &[f32]) -> f32 {
    match op {
        ReduceOp::Max if row.len() < 16 => row.iter().copied().fold(f32::NEG_INFINITY, f32::max),
        ReduceOp::Sum => sum(row),
        ReduceOp::Mean => sum(row) / row.len() as f32,
        ReduceOp::L2Norm => dot(row, row).sqrt(),
        _ => fold(op, row.iter().copied(), row.len()),
    }
}

fn sum(row: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let chunks = row.chunks_exact(16);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for i in 0..16 {
            acc[i] += c[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Reduction over all pages of a materialized `[n, rows, cols]` value.
pub fn reduce_pages(op: ReduceOp, a: View, n: usize, out: &mut [f32]) {
    let e = a.rows * a.cols;
    for (i, o) in out.iter_mut().enumerate().take(e) {
        *o = fold(op, (0..n).map(|t| a.block(t)[i]), n);
    }
}

pub fn softmax(axis: Axis, a: View, count: usize, out: &mut Out) {
    let (rows, cols) = (a.rows, a.cols);
    match axis {
        Axis::Pages => {
            for i in 0..rows * cols {
                let m = (0..count)
                    .map(|t| a.block(t)[i])
                    .fold(f32::NEG_INFINITY, f32::max);
                let mut s = 0.0;
                for t in 0..count {
                    let e = (a.block(t)[i] - m).exp();
                    out.block(t)[i] = e;
                    s += e;
                }
                for t in 0..count {
                    out.block(t)[i] /= s;
                }
            }
        }
        _ => {
            let (n, stride, lines) = if axis == Axis::Cols {
                (cols, 1, rows)
            } else {
                (rows, cols, cols)
            };
            let line_start = |l: usize| if axis == Axis::Cols { l * cols } else { l };
            for t in 0..count {
                let src = a.block(t);
                let dst = out.block(t);
                for l in 0..lines {
                    let idx = |j: usize| line_start(l) + j * stride;
                    let m = (0..n)
                        .map(|j| src[idx(j)])
                        .fold(f32::NEG_INFINITY, f32::max);
                    let mut s = 0.0;
                    for j in 0..n {
                        let e = (src[idx(j)] - m).exp();
                        dst[idx(j)] = e;
                        s += e;
                    }
                    for j in 0..n {
                        dst[idx(j)] /= s;
                    }
                }
            }
        }
    }
}

/// `a · bᵀ` per page.
pub fn dot_blocks(a: View, b: View, count: usize, out: &mut Out) {
    let k = a.cols;
    let (m, n) = (a.rows, b.rows);
    for t in 0..count {
        let (ab, bb) = (a.block(t), b.block(t));
        let ob = out.block(t);
        for j in 0..n {
            let br = &bb[j * k..(j + 1) * k];
            let mut i = 0;
            while i + 4 <= m {
                let d = dot4(&ab[i * k..(i + 4) * k], br);
                for (r, v) in d.into_iter().enumerate() {
                    ob[(i + r) * n + j] = v;
                }
                i += 4;
            }
            for i in i..m {
                ob[i * n + j] = dot(&ab[i * k..(i + 1) * k], br);
            }
        }
    }
}

/// Four rows of `a` (`[4, k]`) dotted with `b`, sharing each load of `b`.
#[inline]
fn dot4(a: &[f32], b: &[f32]) -> [f32; 4] {
    <f32 as Widen>::dot_rows::<4>(a, b)
}

/// `out[m, n] = a[m, k] · bᵀ` with `b` (`[n, k]`) in its stored dtype, converted in registers.
pub fn dot_stored<T: Widen>(a: &[f32], m: usize, b: &[T], out: &mut [f32]) {
    let k = a.len() / m;
    let n = b.len() / k;
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

fn pad<const R: usize>(x: [f32; R]) -> [f32; 4] {
    std::array::from_fn(|i| if i < R { x[i] } else { 0.0 })
}

/// `R` rows of `a` (`[R, k]`, `R <= 4`) dotted with two stored rows `b0` and `b1` (two pages'
/// summaries) at once, sharing each load of `a`.
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
    // SAFETY: offsets `c * 8 .. c * 8 + 8` are within every row, `b0` and `b1` for `c < chunks`.
    unsafe {
        let mut acc0 = [_mm256_setzero_ps(); 4];
        let mut acc1 = [_mm256_setzero_ps(); 4];
        for c in 0..chunks {
            let u = T::load8(b0.as_ptr().add(c * 8));
            let w = T::load8(b1.as_ptr().add(c * 8));
            for r in 0..R {
                let x = _mm256_loadu_ps(rows[r].as_ptr().add(c * 8));
                acc0[r] = _mm256_fmadd_ps(x, u, acc0[r]);
                acc1[r] = _mm256_fmadd_ps(x, w, acc1[r]);
            }
        }
        // One horizontal reduction for four accumulators (unused ones are zero).
        let reduce = |s: [__m256; 4]| {
            let h = _mm256_hadd_ps(_mm256_hadd_ps(s[0], s[1]), _mm256_hadd_ps(s[2], s[3]));
            let q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
            let mut out = [0f32; 4];
            _mm_storeu_ps(out.as_mut_ptr(), q);
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
pub fn envelope_rows<T: Widen>(a: &[f32], hi: &[T], lo: &[T], out: &mut [f32]) {
    let k = hi.len();
    assert!(lo.len() == k && a.len() == out.len() * k);
    let mut r = 0;
    while r < out.len() {
        let rows = &a[r * k..];
        let n = (out.len() - r).min(4);
        let o = &mut out[r..r + n];
        match n {
            1 => o.copy_from_slice(&envelope_block::<1, T>(rows, hi, lo)),
            2 => o.copy_from_slice(&envelope_block::<2, T>(rows, hi, lo)),
            3 => o.copy_from_slice(&envelope_block::<3, T>(rows, hi, lo)),
            _ => o.copy_from_slice(&envelope_block::<4, T>(rows, hi, lo)),
        }
        r += n;
    }
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
    // SAFETY: offsets `c * 8 .. c * 8 + 8` are within `hi`, `lo` and each of the `R` rows of
    // `a` for `c < chunks` (asserted above).
    unsafe {
        let mut acc = [_mm256_setzero_ps(); R];
        for c in 0..chunks {
            let h = T::load8(hi.as_ptr().add(c * 8));
            let l = T::load8(lo.as_ptr().add(c * 8));
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = _mm256_loadu_ps(a.as_ptr().add(r * k + c * 8));
                let m = _mm256_max_ps(_mm256_mul_ps(x, h), _mm256_mul_ps(x, l));
                *acc = _mm256_add_ps(*acc, m);
            }
        }
        std::array::from_fn(|r| {
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc[r]);
            let tail = (chunks * 8..k).map(|c| envelope_term(a, hi, lo, r, c));
            lanes.iter().sum::<f32>() + tail.sum::<f32>()
        })
    }
}

/// A stored element that widens to f32; `dot4` dots four f32 rows with a row of stored values.
pub trait Widen: Copy {
    fn widen(self) -> f32;
    /// Eight values from `p` as f32 lanes.
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    /// # Safety
    /// `p` must point to eight readable values.
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;

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

/// `a · b` per page.
pub fn matmul_blocks(a: View, b: View, count: usize, out: &mut Out) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    for t in 0..count {
        let (ab, bb) = (a.block(t), b.block(t));
        let ob = out.block(t);
        ob.fill(0.0);
        for i in 0..m {
            let or = &mut ob[i * n..(i + 1) * n];
            for p in 0..k {
                let w = ab[i * k + p];
                for (o, &x) in or.iter_mut().zip(&bb[p * n..(p + 1) * n]) {
                    *o += w * x;
                }
            }
        }
    }
}

pub fn transpose(a: View, count: usize, out: &mut Out) {
    let (r, c) = (a.rows, a.cols);
    for t in 0..count {
        let src = a.block(t);
        let dst = out.block(t);
        for i in 0..r {
            for j in 0..c {
                dst[j * r + i] = src[i * c + j];
            }
        }
    }
}

pub fn copy(a: View, count: usize, out: &mut Out) {
    for t in 0..count {
        out.block(t).copy_from_slice(a.block(t));
    }
}

pub fn keep_cols(a: View, cols: &[usize], count: usize, out: &mut Out) {
    for t in 0..count {
        let src = a.block(t);
        let dst = out.block(t);
        for r in 0..a.rows {
            for (j, &c) in cols.iter().enumerate() {
                dst[r * cols.len() + j] = src[r * a.cols + c];
            }
        }
    }
}

pub fn slice(a: View, axis: Axis, start: usize, count: usize, out: &mut Out) {
    let (rows, cols) = (out.rows, out.cols);
    for t in 0..count {
        let src = a.block(t);
        let dst = out.block(t);
        for r in 0..rows {
            let (sr, sc) = if axis == Axis::Rows {
                (r + start, 0)
            } else {
                (r, start)
            };
            dst[r * cols..(r + 1) * cols].copy_from_slice(&src[sr * a.cols + sc..][..cols]);
        }
    }
}
