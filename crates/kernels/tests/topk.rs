use std::cmp::Ordering;
use std::time::Instant;

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use vortex_kernels::topk::{
    TopkScratch, order_key, topk_approx, topk_approx_with, topk_exact, topk_exact_with,
};

/// The documented ranking, written independently of `order_key`: NaN lowest, then IEEE total
/// order (which puts -0.0 below +0.0).
fn rank_cmp(x: f32, y: f32) -> Ordering {
    match (x.is_nan(), y.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        (false, false) => x.total_cmp(&y),
    }
}

fn reference(scores: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..scores.len() as u32).collect();
    idx.sort_by(|&a, &b| rank_cmp(scores[b as usize], scores[a as usize]).then(a.cmp(&b)));
    idx.truncate(k);
    idx.sort_unstable();
    idx
}

fn exact(scores: &[f32], k: usize) -> Vec<u32> {
    let mut out = Vec::new();
    topk_exact(scores, k, &mut out);
    out
}

#[derive(Clone, Copy, Debug)]
enum Dist {
    Normal,
    LogNormal,
    Uniform,
    Bimodal,
}

const DISTS: [Dist; 4] = [Dist::Normal, Dist::LogNormal, Dist::Uniform, Dist::Bimodal];

fn std_normal(rng: &mut StdRng) -> f64 {
    let u1 = 1.0 - rng.random::<f64>();
    let u2 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

fn sample(dist: Dist, n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| match dist {
            Dist::Normal => std_normal(&mut rng) as f32,
            Dist::LogNormal => std_normal(&mut rng).exp() as f32,
            Dist::Uniform => rng.random::<f32>(),
            Dist::Bimodal => {
                let centre = if rng.random::<f64>() < 0.8 { -2.0 } else { 3.0 };
                (centre + 0.7 * std_normal(&mut rng)) as f32
            }
        })
        .collect()
}

#[test]
fn order_key_is_monotone() {
    let ladder = [
        f32::NEG_INFINITY,
        f32::MIN,
        -1.0,
        -f32::MIN_POSITIVE,
        -1e-45,
        -0.0,
        0.0,
        1e-45,
        f32::MIN_POSITIVE,
        1.0,
        f32::MAX,
        f32::INFINITY,
    ];
    assert_eq!(order_key(f32::NAN), 0);
    assert_eq!(order_key(-f32::NAN), 0);
    assert!(order_key(f32::NAN) < order_key(f32::NEG_INFINITY));
    for w in ladder.windows(2) {
        assert!(order_key(w[0]) < order_key(w[1]), "{} vs {}", w[0], w[1]);
    }
}

#[test]
fn exact_edge_cases() {
    assert!(exact(&[], 0).is_empty());
    assert!(exact(&[], 3).is_empty());
    assert!(exact(&[1.0, 2.0], 0).is_empty());
    assert_eq!(exact(&[1.0, 2.0, 0.5], 1), vec![1]);
    assert_eq!(exact(&[1.0, 2.0, 0.5], 3), vec![0, 1, 2]);
    assert_eq!(exact(&[1.0, 2.0, 0.5], 7), vec![0, 1, 2]);
    assert_eq!(exact(&[5.0; 10], 4), vec![0, 1, 2, 3]);
    assert_eq!(exact(&[0.0, -0.0, 0.0, -0.0], 3), vec![0, 1, 2]);
    assert_eq!(exact(&[-0.0, 0.0, -0.0, 0.0], 2), vec![1, 3]);
    let nan = f32::NAN;
    assert_eq!(exact(&[nan, f32::NEG_INFINITY, nan, -f32::NAN], 1), vec![1]);
    assert_eq!(
        exact(&[nan, f32::NEG_INFINITY, nan, -f32::NAN], 2),
        vec![0, 1]
    );
    assert_eq!(
        exact(&[1.0, f32::INFINITY, f32::MAX, f32::INFINITY], 2),
        vec![1, 3]
    );
}

#[test]
fn exact_matches_reference_on_distributions() {
    let mut scratch = TopkScratch::new();
    let mut out = Vec::new();
    for (d, &dist) in DISTS.iter().enumerate() {
        for &n in &[1usize, 7, 33, 100, 513, 4096, 20_000] {
            let scores = sample(dist, n, 1000 + d as u64 * 31 + n as u64);
            for k in [0, 1, 2, n / 16, n / 3, n / 2, n - 1, n, n + 5] {
                topk_exact_with(&mut scratch, &scores, k, &mut out);
                assert_eq!(out, reference(&scores, k), "{dist:?} n={n} k={k}");
            }
        }
    }
}

#[test]
fn heavy_ties_wide_and_dense_ranges() {
    let mut rng = StdRng::seed_from_u64(7);
    let palette = [
        f32::NAN,
        f32::NEG_INFINITY,
        -1.0,
        -0.0,
        0.0,
        1e-30,
        0.5,
        1.0,
        f32::INFINITY,
    ];
    for n in [50usize, 1000, 10_000] {
        let tied: Vec<f32> = (0..n)
            .map(|_| palette[rng.random_range(0..palette.len())])
            .collect();
        let wide: Vec<f32> = (0..n)
            .map(|_| f32::from_bits(rng.random::<u32>()))
            .collect();
        let quantized: Vec<f32> = sample(Dist::Normal, n, n as u64)
            .iter()
            .map(|x| (x * 16.0).round() / 16.0)
            .collect();
        let dense: Vec<f32> = (0..n)
            .map(|_| f32::from_bits(0x3f80_0000 + rng.random_range(0..n as u32 * 2)))
            .collect();
        for scores in [&tied, &wide, &quantized, &dense] {
            for k in [1, n / 10, n / 2, n - 1] {
                assert_eq!(exact(scores, k), reference(scores, k), "n={n} k={k}");
                for tolerance in [0.03, 0.3] {
                    check_approx(
                        scores,
                        k,
                        tolerance,
                        &format!("n={n} k={k} tol={tolerance}"),
                    );
                }
            }
        }
    }
}

fn any_score() -> impl Strategy<Value = f32> {
    prop_oneof![
        3 => any::<f32>(),
        2 => any::<u32>().prop_map(f32::from_bits),
        2 => prop::sample::select(vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            2.5,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7fc0_1234),
        ]),
        3 => (-50i32..50).prop_map(|x| x as f32 * 0.25),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn exact_matches_reference(scores in prop::collection::vec(any_score(), 0..300), k_seed in any::<usize>()) {
        let k = k_seed % (scores.len() + 3);
        prop_assert_eq!(exact(&scores, k), reference(&scores, k));
    }

    #[test]
    fn approx_bound_holds_on_arbitrary_input(
        scores in prop::collection::vec(any_score(), 0..300),
        k_seed in any::<usize>(),
        tolerance in 0.0f32..0.5,
    ) {
        let k = k_seed % (scores.len() + 3);
        check_approx(&scores, k, tolerance, &format!("k={k} tol={tolerance}"));
    }
}

/// Checks the `topk_approx` contract on `scores`; returns the bound it reported.
fn check_approx(scores: &[f32], k: usize, tolerance: f32, what: &str) -> f32 {
    let reference = exact(scores, k);
    let mut out = Vec::new();
    let bound = topk_approx(scores, k, tolerance, &mut out);
    assert_eq!(out.len(), reference.len(), "{what}");
    assert!(
        out.windows(2).all(|w| w[0] < w[1]),
        "{what}: not strictly ascending"
    );
    assert!(
        out.iter().all(|&i| (i as usize) < scores.len()),
        "{what}: out of range"
    );
    assert!(bound >= 1.0 - tolerance, "{what}: bound {bound}");
    if reference.is_empty() {
        assert_eq!(bound, 1.0, "{what}");
    } else {
        let hits = out
            .iter()
            .filter(|i| reference.binary_search(i).is_ok())
            .count();
        let recall = hits as f32 / reference.len() as f32;
        assert!(recall >= bound, "{what}: recall {recall} < bound {bound}");
    }
    if tolerance == 0.0 || bound == 1.0 {
        assert_eq!(out, reference, "{what}: should be exact");
    }
    bound
}

#[test]
fn approx_recall_on_distributions() {
    let mut early_stops = 0;
    for (d, &dist) in DISTS.iter().enumerate() {
        for (s, &n) in [512usize, 2048, 8192, 65_536].iter().enumerate() {
            let scores = sample(dist, n, 77 + 10 * d as u64 + s as u64);
            for k in [1, n / 64, n / 16, n / 4, n / 2] {
                for tolerance in [0.0, 0.03, 0.1] {
                    let what = format!("{dist:?} n={n} k={k} tol={tolerance}");
                    let bound = check_approx(&scores, k, tolerance, &what);
                    if bound < 1.0 {
                        early_stops += 1;
                    }
                }
            }
        }
    }
    assert!(early_stops > 0, "approx never stopped early");
}

#[test]
fn approx_on_edge_inputs() {
    let mut out = Vec::new();
    assert_eq!(topk_approx(&[], 4, 0.1, &mut out), 1.0);
    assert!(out.is_empty());
    assert_eq!(topk_approx(&[1.0, 2.0], 0, 0.1, &mut out), 1.0);
    assert!(out.is_empty());
    assert_eq!(topk_approx(&[1.0, 2.0], 5, 0.1, &mut out), 1.0);
    assert_eq!(out, vec![0, 1]);
    let scores = sample(Dist::Normal, 4096, 5);
    for tolerance in [f32::NAN, -1.0, 0.0, 1.0, 2.0] {
        let effective = if tolerance.is_nan() {
            0.0
        } else {
            tolerance.clamp(0.0, 1.0)
        };
        check_approx(&scores, 256, effective, &format!("tolerance {tolerance}"));
        let bound = topk_approx(&scores, 256, tolerance, &mut out);
        assert!((0.0..=1.0).contains(&bound));
    }
}

/// Best of several batches, which discounts interference from other processes.
fn ns_per_call(mut f: impl FnMut(usize)) -> f64 {
    let mut iters = 1usize;
    loop {
        let start = Instant::now();
        for i in 0..iters {
            f(i);
        }
        if start.elapsed().as_millis() >= 5 {
            break;
        }
        iters *= 2;
    }
    (0..5)
        .map(|_| {
            let start = Instant::now();
            for i in 0..iters {
                f(i);
            }
            start.elapsed().as_nanos() as f64 / iters as f64
        })
        .fold(f64::INFINITY, f64::min)
}

#[test]
#[ignore = "timing; run with --release -- --ignored --nocapture"]
fn timing_exact_vs_approx() {
    const INPUTS: usize = 8;
    let tolerance = 0.03;
    let mut scratch = TopkScratch::new();
    let mut out = Vec::new();
    println!(
        "{:<10} {:>6} {:>5} {:>11} {:>11} {:>7} {:>7} {:>7}",
        "dist", "n", "k", "exact ns", "approx ns", "speedup", "bound", "recall"
    );
    for &dist in &DISTS {
        for &n in &[2048usize, 8192, 32_768] {
            let k = n / 16;
            let inputs: Vec<Vec<f32>> = (0..INPUTS)
                .map(|i| sample(dist, n, 9000 + i as u64))
                .collect();
            let (mut bound_sum, mut recall_sum) = (0.0f64, 0.0f64);
            for scores in &inputs {
                let reference = exact(scores, k);
                bound_sum += f64::from(topk_approx_with(
                    &mut scratch,
                    scores,
                    k,
                    tolerance,
                    &mut out,
                ));
                let hits = out
                    .iter()
                    .filter(|i| reference.binary_search(i).is_ok())
                    .count();
                recall_sum += hits as f64 / k as f64;
            }
            // Alternate the two so that drifting machine load hits both alike.
            let (mut t_exact, mut t_approx) = (f64::INFINITY, f64::INFINITY);
            for _ in 0..3 {
                t_exact = t_exact.min(ns_per_call(|i| {
                    topk_exact_with(&mut scratch, &inputs[i % INPUTS], k, &mut out);
                    std::hint::black_box(&out);
                }));
                t_approx = t_approx.min(ns_per_call(|i| {
                    let bound =
                        topk_approx_with(&mut scratch, &inputs[i % INPUTS], k, tolerance, &mut out);
                    std::hint::black_box((bound, &out));
                }));
            }
            println!(
                "{:<10} {:>6} {:>5} {:>11.0} {:>11.0} {:>6.2}x {:>7.4} {:>7.4}",
                format!("{dist:?}"),
                n,
                k,
                t_exact,
                t_approx,
                t_exact / t_approx,
                bound_sum / INPUTS as f64,
                recall_sum / INPUTS as f64,
            );
        }
    }
}
