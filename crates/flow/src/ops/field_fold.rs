//! A reduction over the columns of an element-wise pair of a step value and a one-row page
//! field, `reduce(op, cols, pair(s, f))`, in one pass over the field's stored values widened in
//! registers: no `[rows, cols]` block of pairs is written for each page.

use super::{Widen, fold};
use crate::ir::{BinaryOp, ReduceOp};

/// Whether [`fold_field_rows`] takes `pair` in vector registers (other pairs, comparisons and
/// `mod`, are evaluated value by value).
pub fn folds_in_vectors(pair: BinaryOp) -> bool {
    matches!(
        pair,
        BinaryOp::Add
            | BinaryOp::Sub
            | BinaryOp::Mul
            | BinaryOp::Div
            | BinaryOp::Max
            | BinaryOp::Min
    )
}

/// `out[r]` = `op` over the columns `c` of `pair(a[r, c], b[c])` (`pair(b[c], a[r, c])` where
/// `field_first`) for the rows of `a` (`[out.len(), k]`, `k = b.len()`).
pub fn fold_field_rows<T: Widen>(
    op: ReduceOp,
    pair: BinaryOp,
    field_first: bool,
    a: &[f32],
    b: &[T],
    out: &mut [f32],
) {
    let k = b.len();
    assert_eq!(a.len(), out.len() * k, "one row of `a` a value of `out`");
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    if k.is_multiple_of(16) && folds_in_vectors(pair) {
        // SAFETY: the build targets AVX2 and FMA (checked by cfg); `k` is a multiple of 16.
        unsafe { wide::fold(op, pair, field_first, a, b, out) };
        return;
    }
    for (r, o) in out.iter_mut().enumerate() {
        let row = &a[r * k..(r + 1) * k];
        let pairs = row.iter().zip(b).map(|(&s, f)| {
            let f = f.widen();
            let (x, y) = if field_first { (f, s) } else { (s, f) };
            element(pair, x, y)
        });
        *o = fold(op, pairs, k);
    }
}

/// `pair(x, y)` as the node-by-node evaluation computes it.
fn element(pair: BinaryOp, x: f32, y: f32) -> f32 {
    let flag = |c: bool| if c { 1.0 } else { 0.0 };
    match pair {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Max => x.max(y),
        BinaryOp::Min => x.min(y),
        BinaryOp::Gt => flag(x > y),
        BinaryOp::Ge => flag(x >= y),
        BinaryOp::Lt => flag(x < y),
        BinaryOp::Le => flag(x <= y),
        BinaryOp::Eq => flag(x == y),
        BinaryOp::Ne => flag(x != y),
        BinaryOp::Mod => x - y * (x / y).floor(),
    }
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
mod wide {
    use std::arch::x86_64::*;

    use super::super::Widen;
    use crate::ir::{BinaryOp, ReduceOp};

    /// [`super::fold_field_rows`] for a pair [`super::folds_in_vectors`] takes and `k` a
    /// multiple of 16.
    ///
    /// # Safety
    /// AVX2 and FMA must be available; `b.len()` must be a multiple of 16.
    pub unsafe fn fold<T: Widen>(
        op: ReduceOp,
        pair: BinaryOp,
        field_first: bool,
        a: &[f32],
        b: &[T],
        out: &mut [f32],
    ) {
        if b.len() > MAX_WIDENED {
            // SAFETY: the caller's guarantees.
            return unsafe { by_pair(op, pair, field_first, a, b, out) };
        }
        // The field widened once for all rows (fp8's widening is a dozen instructions; where
        // no value is NaN, its raw widening and a multiply by a power of two give the same
        // values in fewer).
        let raw = T::RAW_SCALE != 1.0 && T::raw_ok(b);
        let mut widened = [std::mem::MaybeUninit::<f32>::uninit(); MAX_WIDENED];
        // SAFETY: each `c + 8 <= b.len()` (a multiple of 8) is within `b` and `widened`; the
        // first `b.len()` values of `widened` are written before they are read.
        unsafe {
            let dst = widened.as_mut_ptr().cast::<f32>();
            let scale = _mm256_set1_ps(T::RAW_SCALE);
            for c in (0..b.len()).step_by(8) {
                let p = b.as_ptr().add(c);
                let v = if raw {
                    _mm256_mul_ps(T::load8_raw(p), scale)
                } else {
                    T::load8(p)
                };
                _mm256_storeu_ps(dst.add(c), v);
            }
            let b = std::slice::from_raw_parts(dst.cast_const(), b.len());
            by_pair(op, pair, field_first, a, b, out)
        }
    }

    /// Columns of a field widened once a page into a buffer on the stack, at most.
    const MAX_WIDENED: usize = 512;

    #[inline(always)]
    unsafe fn by_pair<T: Widen>(
        op: ReduceOp,
        pair: BinaryOp,
        field_first: bool,
        a: &[f32],
        b: &[T],
        out: &mut [f32],
    ) {
        // The larger (smaller) of a pair skips a NaN operand as `f32::max` does: the vector
        // instruction gives its second operand where either is NaN, so that one is replaced by
        // the other where it is NaN.
        #[inline(always)]
        unsafe fn max(x: __m256, y: __m256) -> __m256 {
            // SAFETY: the caller's guarantees.
            unsafe {
                let y_nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(y, y);
                _mm256_blendv_ps(_mm256_max_ps(x, y), x, y_nan)
            }
        }
        #[inline(always)]
        unsafe fn min(x: __m256, y: __m256) -> __m256 {
            // SAFETY: the caller's guarantees.
            unsafe {
                let y_nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(y, y);
                _mm256_blendv_ps(_mm256_min_ps(x, y), x, y_nan)
            }
        }
        // SAFETY (every arm): the caller's guarantees.
        unsafe {
            match (pair, field_first) {
                (BinaryOp::Add, _) => rows(op, a, b, out, |s, f| _mm256_add_ps(s, f)),
                (BinaryOp::Mul, _) => rows(op, a, b, out, |s, f| _mm256_mul_ps(s, f)),
                (BinaryOp::Max, _) => rows(op, a, b, out, |s, f| max(s, f)),
                (BinaryOp::Min, _) => rows(op, a, b, out, |s, f| min(s, f)),
                (BinaryOp::Sub, false) => rows(op, a, b, out, |s, f| _mm256_sub_ps(s, f)),
                (BinaryOp::Sub, true) => rows(op, a, b, out, |s, f| _mm256_sub_ps(f, s)),
                (BinaryOp::Div, false) => rows(op, a, b, out, |s, f| _mm256_div_ps(s, f)),
                (BinaryOp::Div, true) => rows(op, a, b, out, |s, f| _mm256_div_ps(f, s)),
                _ => unreachable!("pairs outside folds_in_vectors are folded value by value"),
            }
        }
    }

    /// Each row folded with `op` over its pairs with the field (`pair(step, field)`).
    #[inline(always)]
    unsafe fn rows<T: Widen>(
        op: ReduceOp,
        a: &[f32],
        b: &[T],
        out: &mut [f32],
        pair: impl Fn(__m256, __m256) -> __m256 + Copy,
    ) {
        // SAFETY (every arm): the caller's guarantees.
        unsafe {
            match op {
                ReduceOp::Sum | ReduceOp::Mean => {
                    let sum = |acc, v| _mm256_add_ps(acc, v);
                    let zero = _mm256_setzero_ps();
                    each(a, b, out, pair, sum, sum, zero, lanes_sum)
                }
                ReduceOp::L2Norm => {
                    let squares = |acc, v| _mm256_fmadd_ps(v, v, acc);
                    let sum = |acc, v| _mm256_add_ps(acc, v);
                    let zero = _mm256_setzero_ps();
                    each(a, b, out, pair, squares, sum, zero, |v| lanes_sum(v).sqrt())
                }
                // The running extreme never holds NaN: a NaN pair is skipped (the second operand
                // is kept), as the node-by-node fold skips it.
                ReduceOp::Max => {
                    let larger = |acc, v| _mm256_max_ps(v, acc);
                    let init = _mm256_set1_ps(f32::NEG_INFINITY);
                    each(a, b, out, pair, larger, larger, init, |v| {
                        lanes(v, f32::max)
                    })
                }
                ReduceOp::Min => {
                    let smaller = |acc, v| _mm256_min_ps(v, acc);
                    let init = _mm256_set1_ps(f32::INFINITY);
                    each(a, b, out, pair, smaller, smaller, init, |v| {
                        lanes(v, f32::min)
                    })
                }
            }
        }
        if op == ReduceOp::Mean {
            let k = b.len() as f32;
            out.iter_mut().for_each(|o| *o /= k);
        }
    }

    /// Two accumulators a row (even and odd chunks of 8), each taking a chunk's pairs with
    /// `step`, then combined and finished.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    unsafe fn each<T: Widen>(
        a: &[f32],
        b: &[T],
        out: &mut [f32],
        pair: impl Fn(__m256, __m256) -> __m256,
        step: impl Fn(__m256, __m256) -> __m256,
        combine: impl Fn(__m256, __m256) -> __m256,
        init: __m256,
        finish: impl Fn(__m256) -> f32,
    ) {
        let k = b.len();
        for (r, o) in out.iter_mut().enumerate() {
            let row = a[r * k..(r + 1) * k].as_ptr();
            let (mut even, mut odd) = (init, init);
            let mut c = 0;
            while c < k {
                // SAFETY: `c + 16 <= k` (`k` a multiple of 16), within the row and `b`.
                unsafe {
                    let f0 = T::load8(b.as_ptr().add(c));
                    let f1 = T::load8(b.as_ptr().add(c + 8));
                    even = step(even, pair(_mm256_loadu_ps(row.add(c)), f0));
                    odd = step(odd, pair(_mm256_loadu_ps(row.add(c + 8)), f1));
                }
                c += 16;
            }
            *o = finish(combine(even, odd));
        }
    }

    #[inline(always)]
    fn lanes_sum(v: __m256) -> f32 {
        // SAFETY: AVX2 is available (the module's cfg).
        unsafe {
            let q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let q = _mm_add_ps(q, _mm_movehl_ps(q, q));
            _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)))
        }
    }

    #[inline(always)]
    fn lanes(v: __m256, f: impl Fn(f32, f32) -> f32) -> f32 {
        let mut x = [0f32; 8];
        // SAFETY: AVX2 is available; `x` holds eight values.
        unsafe { _mm256_storeu_ps(x.as_mut_ptr(), v) };
        x.into_iter().reduce(f).expect("eight lanes")
    }
}
