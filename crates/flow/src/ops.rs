//! Operator kernels on blocks of pages. A [`View`] is `count` consecutive `[rows, cols]` blocks
//! (one per page) or a single block broadcast to every page.

use crate::ir::{Axis, BinaryOp, ReduceOp, UnaryOp};
use vortex_kernels::simd::Simd;

mod field_fold;
mod stored;

pub use field_fold::{fold_field_rows, folds_in_vectors};
pub use stored::{Widen, dot_pair, dot_stored, envelope_rows};

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
    if a.per_page && axis == Axis::Cols {
        // The tile's rows are contiguous: one loop over all of them.
        fold_rows(
            op,
            &a.data[..count * rows * cols],
            cols,
            &mut out.data[..count * rows],
        );
        return;
    }
    if a.per_page && axis == Axis::Rows && cols == 1 {
        // One value per page from a column of `rows` values.
        fold_rows(op, &a.data[..count * rows], rows, &mut out.data[..count]);
        return;
    }
    for t in 0..count {
        let src = a.block(t);
        let dst = out.block(t);
        match axis {
            Axis::Rows => {
                match op {
                    ReduceOp::Max | ReduceOp::Min | ReduceOp::Sum | ReduceOp::Mean => {
                        // Max and min start from -inf and +inf, as the other paths and the GPU
                        // do: a column of NaN alone gives the start, not NaN.
                        dst.fill(match op {
                            ReduceOp::Max => f32::NEG_INFINITY,
                            ReduceOp::Min => f32::INFINITY,
                            _ => 0.0,
                        });
                        for r in 0..rows {
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
                    dst[r] = fold_row(op, &src[r * cols..(r + 1) * cols], simd());
                }
            }
            Axis::Pages => unreachable!("page reductions are barriers"),
        }
    }
}

pub(crate) fn fold(op: ReduceOp, xs: impl Iterator<Item = f32>, n: usize) -> f32 {
    match op {
        ReduceOp::Sum => xs.sum(),
        ReduceOp::Mean => xs.sum::<f32>() / n as f32,
        ReduceOp::Max => xs.fold(f32::NEG_INFINITY, f32::max),
        ReduceOp::Min => xs.fold(f32::INFINITY, f32::min),
        ReduceOp::L2Norm => xs.map(|x| x * x).sum::<f32>().sqrt(),
    }
}

/// `out[i]` = `data[i * width..(i + 1) * width]` folded with `op`. The operator is matched
/// once, so each row's fold is inlined into the loop.
fn fold_rows(op: ReduceOp, data: &[f32], width: usize, out: &mut [f32]) {
    #[inline(always)]
    fn each(data: &[f32], width: usize, out: &mut [f32], op: ReduceOp) {
        let simd = simd();
        for (d, row) in out.iter_mut().zip(data.chunks_exact(width)) {
            *d = fold_row(op, row, simd);
        }
    }
    match op {
        ReduceOp::Max => each(data, width, out, ReduceOp::Max),
        ReduceOp::Min => each(data, width, out, ReduceOp::Min),
        ReduceOp::Sum => each(data, width, out, ReduceOp::Sum),
        ReduceOp::Mean => each(data, width, out, ReduceOp::Mean),
        ReduceOp::L2Norm => each(data, width, out, ReduceOp::L2Norm),
    }
}

/// `row` folded with `op`. Sums go to the vector primitives: an array of partial sums the
/// compiler vectorises two lanes at a time, three times slower.
#[inline(always)]
fn fold_row(op: ReduceOp, row: &[f32], simd: Simd) -> f32 {
    match op {
        // Rows shorter than a vector (a KV group's query heads) are cheaper folded in order.
        ReduceOp::Max if row.len() < 8 => row.iter().copied().fold(f32::NEG_INFINITY, max_from),
        ReduceOp::Min if row.len() < 8 => row.iter().copied().fold(f32::INFINITY, min_from),
        ReduceOp::Max => lanes_fold(row, f32::NEG_INFINITY, max_from),
        ReduceOp::Min => lanes_fold(row, f32::INFINITY, min_from),
        ReduceOp::Sum => simd.sum(row),
        ReduceOp::Mean => simd.sum(row) / row.len() as f32,
        ReduceOp::L2Norm => simd.dot(row, row).sqrt(),
    }
}

/// The widest vector primitives of this CPU, found once.
fn simd() -> Simd {
    static SIMD: std::sync::OnceLock<Simd> = std::sync::OnceLock::new();
    *SIMD.get_or_init(Simd::detect)
}

/// `acc.max(x)` where `acc` is never NaN (a fold from -inf): a NaN `x` is skipped as
/// `f32::max` skips it, in one compare-and-pick, which is one vector instruction.
#[inline(always)]
fn max_from(acc: f32, x: f32) -> f32 {
    if x > acc { x } else { acc }
}

/// `acc.min(x)` where `acc` is never NaN, as [`max_from`].
#[inline(always)]
fn min_from(acc: f32, x: f32) -> f32 {
    if x < acc { x } else { acc }
}

/// `row` folded with `f` in eight interleaved lanes, which vectorises; `f` must not care
/// about the order (max and min).
fn lanes_fold(row: &[f32], init: f32, f: impl Fn(f32, f32) -> f32 + Copy) -> f32 {
    let mut acc = [init; 8];
    let chunks = row.chunks_exact(8);
    let tail = chunks.remainder().iter().copied().fold(init, f);
    for c in chunks {
        for i in 0..8 {
            acc[i] = f(acc[i], c[i]);
        }
    }
    acc.into_iter().fold(tail, f)
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
            // Each element's line over the pages, gathered so that the exponentials run
            // vectorised (a page's element after another's is `rows * cols` values away).
            let simd = simd();
            let mut line = vec![0f32; count];
            for i in 0..rows * cols {
                for (t, x) in line.iter_mut().enumerate() {
                    *x = a.block(t)[i];
                }
                let m = line.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let s = simd.exp_shifted(&mut line, m);
                for (t, e) in line.iter().enumerate() {
                    out.block(t)[i] = e / s;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_folds_match_a_sequential_fold() {
        for n in [0, 1, 7, 8, 9, 16, 17, 40] {
            let mut row: Vec<f32> = (0..n).map(|i| ((i * 37 % 23) as f32).sin()).collect();
            // NaNs are skipped, in a lane's first value, its later ones and the tail.
            for i in [0, 3, 9, 16] {
                if i < n {
                    row[i] = f32::NAN;
                }
            }
            for op in [ReduceOp::Max, ReduceOp::Min] {
                let want = fold(op, row.iter().copied(), n);
                assert_eq!(fold_row(op, &row, simd()), want, "{op:?} n={n}");
            }
        }
    }

    /// Per-page reductions over a row (every row of every page in one loop) and over a column
    /// of one value a row give each row's and each column's fold.
    #[test]
    fn per_page_reductions_fold_every_row_and_column() {
        let ops = [
            ReduceOp::Sum,
            ReduceOp::Mean,
            ReduceOp::Max,
            ReduceOp::Min,
            ReduceOp::L2Norm,
        ];
        for (count, rows, cols) in [(5, 4, 16), (3, 1, 9), (7, 6, 1), (2, 3, 20)] {
            let data: Vec<f32> = (0..count * rows * cols)
                .map(|i| ((i * 29 % 31) as f32 * 0.7).cos())
                .collect();
            let a = View {
                data: &data,
                per_page: true,
                rows,
                cols,
            };
            for op in ops {
                let mut got = vec![f32::NAN; count * rows];
                let mut out = Out {
                    data: &mut got,
                    rows,
                    cols: 1,
                };
                reduce(op, Axis::Cols, a, count, &mut out);
                for (i, row) in data.chunks(cols).enumerate() {
                    let want = fold(op, row.iter().copied(), cols);
                    assert!((got[i] - want).abs() <= 1e-5, "{op:?} cols row {i}");
                }
                if cols == 1 {
                    let mut got = vec![f32::NAN; count];
                    let mut out = Out {
                        data: &mut got,
                        rows: 1,
                        cols: 1,
                    };
                    reduce(op, Axis::Rows, a, count, &mut out);
                    for (t, page) in data.chunks(rows).enumerate() {
                        let want = fold(op, page.iter().copied(), rows);
                        assert!((got[t] - want).abs() <= 1e-5, "{op:?} rows page {t}");
                    }
                }
            }
        }
    }

    /// A softmax over pages is each element's normalised exponentials over the pages, a page
    /// at -inf taking none of the mass.
    #[test]
    fn softmax_over_pages_matches_its_definition() {
        let (rows, cols) = (2, 3);
        let e = rows * cols;
        for count in [1, 5, 16, 17, 300] {
            let mut data: Vec<f32> = (0..count * e)
                .map(|i| ((i * 37 % 101) as f32 * 0.31).sin() * 20.0)
                .collect();
            if count > 1 {
                data[e + 4] = f32::NEG_INFINITY;
            }
            let a = View {
                data: &data,
                per_page: true,
                rows,
                cols,
            };
            let mut got = vec![f32::NAN; count * e];
            let mut out = Out {
                data: &mut got,
                rows,
                cols,
            };
            softmax(Axis::Pages, a, count, &mut out);
            for i in 0..e {
                let line: Vec<f64> = (0..count).map(|t| data[t * e + i] as f64).collect();
                let m = line.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let s: f64 = line.iter().map(|x| (x - m).exp()).sum();
                for (t, x) in line.iter().enumerate() {
                    let want = (x - m).exp() / s;
                    let g = got[t * e + i] as f64;
                    assert!(
                        (g - want).abs() <= 1e-5 * want + 1e-30,
                        "count {count} element {i} page {t}: {g} vs {want}"
                    );
                }
            }
        }
    }

    /// Over rows or over columns, a max or min of NaN alone is the fold's start (-inf or
    /// +inf), never NaN: the same pages are chosen whichever way a flow reduces.
    #[test]
    fn a_column_of_nan_folds_to_the_start_on_every_axis() {
        let nan = [f32::NAN; 6];
        for (op, start) in [
            (ReduceOp::Max, f32::NEG_INFINITY),
            (ReduceOp::Min, f32::INFINITY),
        ] {
            for (axis, rows, cols) in [(Axis::Rows, 2, 3), (Axis::Cols, 3, 2)] {
                let a = View {
                    data: &nan,
                    per_page: false,
                    rows,
                    cols,
                };
                let mut got = vec![0.0; 3];
                let (r, c) = if axis == Axis::Rows { (1, 3) } else { (3, 1) };
                reduce(
                    op,
                    axis,
                    a,
                    1,
                    &mut Out {
                        data: &mut got,
                        rows: r,
                        cols: c,
                    },
                );
                assert_eq!(got, [start; 3], "{op:?} {axis:?}");
            }
        }
    }
}
