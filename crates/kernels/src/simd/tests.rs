use half::{bf16, f16};
use vortex_kv::{F8E4M3, KvElem};

use super::*;

fn levels() -> Vec<Simd> {
    [Level::Avx512, Level::Avx2, Level::Scalar]
        .into_iter()
        .filter_map(Simd::with_level)
        .collect()
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

fn check_dot_axpy<T: KvElem>() {
    for n in [0, 1, 7, 8, 15, 16, 17, 31, 32, 33, 64, 100, 129] {
        let a = values(n, 1);
        let b: Vec<T> = values(n, 2).into_iter().map(T::from_f32).collect();
        let want: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| *x as f64 * y.to_f32() as f64)
            .sum();
        for s in levels() {
            let got = s.dot(&a, &b);
            assert!(
                (got as f64 - want).abs() < 1e-4,
                "{s:?} n={n}: {got} vs {want}"
            );
            let mut acc = a.clone();
            s.axpy(&mut acc, 0.5, &b);
            for i in 0..n {
                let want = a[i] + 0.5 * b[i].to_f32();
                assert!((acc[i] - want).abs() < 1e-6, "{s:?} n={n} i={i}");
            }
        }
    }
}

#[test]
fn dot_and_axpy_agree_across_levels() {
    check_dot_axpy::<f32>();
    check_dot_axpy::<f16>();
    check_dot_axpy::<bf16>();
    check_dot_axpy::<F8E4M3>();
}

/// Every fp8 byte widens as the scalar table says (subnormals, NaN and both zeros included),
/// at every alignment of the vector loads and of their masked tails.
#[test]
fn every_fp8_byte_widens_exactly() {
    let all: Vec<F8E4M3> = (0..=255u8).map(F8E4M3).collect();
    for s in levels() {
        for start in 0..17 {
            let x = &all[start..];
            let mut acc = vec![0.0f32; x.len()];
            s.axpy(&mut acc, 1.0, x);
            for (i, (got, b)) in acc.iter().zip(x).enumerate() {
                let want = b.to_f32();
                let same = got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan())
                    // 0 + -0 is +0
                    || (*got == 0.0 && want == 0.0);
                assert!(same, "{s:?} byte {:#04x} at {i}: {got} vs {want}", b.0);
            }
        }
    }
}

#[test]
fn reductions_and_exp() {
    for n in [0, 1, 5, 16, 17, 64, 65, 200] {
        let x = values(n, 3);
        let want_sum: f32 = x.iter().sum();
        let want_max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for s in levels() {
            assert!((s.sum(&x) - want_sum).abs() < 1e-4);
            assert_eq!(s.max(&x), want_max);
            let mut scaled = x.clone();
            s.scale(&mut scaled, 3.0);
            assert!(scaled.iter().zip(&x).all(|(a, b)| *a == b * 3.0));
            let mut e = x.iter().map(|v| v * 40.0).collect::<Vec<_>>();
            let total = s.exp_shifted(&mut e, 10.0);
            let mut want_total = 0.0;
            for (i, &v) in x.iter().enumerate() {
                let want = (v * 40.0 - 10.0).exp();
                want_total += want;
                assert!((e[i] - want).abs() <= 2e-7 * want + 1e-37, "{s:?} {v}");
            }
            assert!((total - want_total).abs() <= 1e-5 * want_total);
        }
    }
    for s in levels() {
        let mut e = vec![-1000.0, f32::NEG_INFINITY, 0.0, -87.0, -88.0];
        s.exp_shifted(&mut e, 0.0);
        assert_eq!(&e[..3], &[0.0, 0.0, 1.0]);
        assert!(e[3] > 0.0 && e[4] >= 0.0);
    }
}

/// A NaN score stays NaN through the exponential at every level, in the body of a vector and in
/// its tail, so a softmax over it is NaN whichever kernel ran it.
#[test]
fn exp_keeps_nan() {
    for n in [1, 7, 8, 9, 16, 17, 33] {
        for at in [0, n / 2, n - 1] {
            for s in levels() {
                let mut e = vec![0.5; n];
                e[at] = f32::NAN;
                let total = s.exp_shifted(&mut e, 0.25);
                assert!(e[at].is_nan(), "{s:?} n {n} at {at}: {}", e[at]);
                assert!(total.is_nan(), "{s:?} n {n} at {at}: sum {total}");
                for (i, v) in e.iter().enumerate() {
                    if i != at {
                        let want = 0.25f32.exp();
                        assert!((v - want).abs() <= 2e-7 * want, "{s:?} n {n} at {at}: {i}");
                    }
                }
            }
        }
    }
}

fn check_group<T: KvElem>() {
    for (heads, dim, tokens) in [
        (1, 16, 3),
        (4, 128, 16),
        (5, 40, 7),
        (8, 64, 1),
        (3, 8, 5),
        (1, 24, 33),
        (2, 72, 17),
        (6, 130, 9),
    ] {
        let q = values(heads * dim, 4);
        let keys: Vec<T> = values(tokens * dim, 5)
            .into_iter()
            .map(T::from_f32)
            .collect();
        let probs = values(heads * tokens, 6);
        let reference = Simd::scalar();
        let mut want_scores = vec![0.0; heads * tokens];
        reference.group_scores(&q, &keys, dim, 0.25, &mut want_scores, &[]);
        let mut want_acc = values(heads * dim, 7);
        let start = want_acc.clone();
        reference.group_accumulate(&probs, &keys, dim, &mut want_acc, &[]);
        for s in levels() {
            let mut scores = vec![0.0; heads * tokens];
            s.group_scores(&q, &keys, dim, 0.25, &mut scores, &keys[dim..]);
            for (a, b) in scores.iter().zip(&want_scores) {
                assert!((a - b).abs() < 1e-5, "{s:?} h={heads} d={dim}: {a} vs {b}");
            }
            let mut acc = start.clone();
            s.group_accumulate(&probs, &keys, dim, &mut acc, &keys);
            for (a, b) in acc.iter().zip(&want_acc) {
                assert!((a - b).abs() < 1e-5, "{s:?} h={heads} d={dim}: {a} vs {b}");
            }
        }
    }
}

#[test]
fn group_kernels_agree_across_levels() {
    check_group::<f32>();
    check_group::<f16>();
    check_group::<bf16>();
    check_group::<F8E4M3>();
}

/// A NaN byte in an fp8 page makes NaN exactly where it is read, and leaves every other score
/// and accumulator bit for bit as it was: pages with and without NaN bytes take different
/// widening paths, which must agree.
#[test]
fn fp8_nan_bytes_stay_where_they_are() {
    // The second page's NaN byte sits past its last whole 256-byte block.
    for (heads, dim, tokens, t, d) in [(4, 128, 16, 5, 77), (3, 40, 7, 6, 39)] {
        check_fp8_nan(heads, dim, tokens, t, d);
    }
}

fn check_fp8_nan(heads: usize, dim: usize, tokens: usize, t: usize, d: usize) {
    let q = values(heads * dim, 4);
    let probs = values(heads * tokens, 6);
    let clean: Vec<F8E4M3> = values(tokens * dim, 5)
        .into_iter()
        .map(F8E4M3::from_f32)
        .collect();
    for nan in [0x7f, 0xff] {
        let mut dirty = clean.clone();
        dirty[t * dim + d] = F8E4M3(nan);
        // The clean page differs from the dirty one at (t, d) only: with a 0 there both
        // take the same values everywhere else.
        let mut zeroed = clean.clone();
        zeroed[t * dim + d] = F8E4M3(0);
        for s in levels() {
            let mut want = vec![0.0; heads * tokens];
            s.group_scores(&q, &zeroed, dim, 0.25, &mut want, &[]);
            let mut got = vec![0.0; heads * tokens];
            s.group_scores(&q, &dirty, dim, 0.25, &mut got, &[]);
            for h in 0..heads {
                for u in 0..tokens {
                    let (g, w) = (got[h * tokens + u], want[h * tokens + u]);
                    if u == t {
                        assert!(g.is_nan(), "{s:?} {nan:#x}: score ({h}, {u}) = {g}");
                    } else {
                        assert_eq!(g.to_bits(), w.to_bits(), "{s:?} {nan:#x}: ({h}, {u})");
                    }
                }
            }
            let start = values(heads * dim, 7);
            let mut want = start.clone();
            s.group_accumulate(&probs, &zeroed, dim, &mut want, &[]);
            let mut got = start.clone();
            s.group_accumulate(&probs, &dirty, dim, &mut got, &[]);
            for h in 0..heads {
                for e in 0..dim {
                    let (g, w) = (got[h * dim + e], want[h * dim + e]);
                    if e == d {
                        assert!(g.is_nan(), "{s:?} {nan:#x}: acc ({h}, {e}) = {g}");
                    } else {
                        assert_eq!(g.to_bits(), w.to_bits(), "{s:?} {nan:#x}: ({h}, {e})");
                    }
                }
            }
        }
    }
}

#[test]
fn max_skips_nan_wherever_it_sits() {
    for n in [1usize, 8, 9, 16, 17, 40] {
        for at in 0..n {
            let mut x: Vec<f32> = (0..n).map(|i| i as f32).collect();
            x[at] = f32::NAN;
            let want = if at + 1 == n && n > 1 {
                (n - 2) as f32
            } else if n == 1 {
                f32::NEG_INFINITY
            } else {
                (n - 1) as f32
            };
            for s in levels() {
                assert_eq!(s.max(&x), want, "{s:?} n={n} NaN at {at}");
            }
        }
    }
}

#[test]
fn group_kernels_take_zero_tokens() {
    let q = values(2 * 8, 3);
    for s in levels() {
        s.group_scores::<f32>(&q, &[], 8, 1.0, &mut [], &[]);
        let mut acc = vec![1.0f32; 2 * 8];
        s.group_accumulate::<f32>(&[], &[], 8, &mut acc, &[]);
        assert!(acc.iter().all(|&a| a == 1.0), "{s:?}");
    }
}
