//! The GPU top-k against a CPU sort: exact top-k equal to it (ties to the lower index), the
//! approximate one within its recall bound, on normal, log-normal, uniform, bimodal and tied
//! scores. The `#[ignore]`d `gpu_topk_speed` times both. Skips visibly without a GPU.

mod common;

use rand::{Rng, SeedableRng, rngs::StdRng};
use vortex_cuda::timing::{median, time_runs};
use vortex_cuda::topk::{GpuTopk, required};

const DISTS: [&str; 5] = ["normal", "log-normal", "uniform", "bimodal", "ties"];

fn normal(rng: &mut StdRng) -> f32 {
    let (u, v): (f64, f64) = (rng.random::<f64>().max(1e-300), rng.random());
    ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
}

fn draw(rng: &mut StdRng, dist: &str, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| match dist {
            "normal" => normal(rng),
            "log-normal" => normal(rng).exp(),
            "uniform" => rng.random::<f32>(),
            "bimodal" => normal(rng) * 0.5 + if rng.random::<bool>() { 4.0 } else { -4.0 },
            _ => (rng.random::<u32>() % 7) as f32 - 3.0,
        })
        .collect()
}

/// Indices of the `k` largest of `row` (ties to the lower index), ascending.
fn sort_topk(row: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    idx.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
    idx.truncate(k);
    idx.sort_unstable();
    idx
}

fn check(got: &[u32], want: &[u32], n: usize) -> usize {
    assert!(
        got.windows(2).all(|w| w[0] < w[1]),
        "not ascending: {got:?}"
    );
    assert!(got.iter().all(|&i| (i as usize) < n));
    got.iter().filter(|i| want.binary_search(i).is_ok()).count()
}

#[test]
fn gpu_topk_matches_a_cpu_sort() {
    let Some(dev) = common::device_or_skip("gpu_topk_matches_a_cpu_sort") else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(common::test_seed());
    let topk = GpuTopk::new(&dev).unwrap();
    let rows = 6;
    for (n, k) in [
        (2048, 126),
        (100, 7),
        (1, 1),
        (300, 300),
        (8190, 510),
        (33_000, 2000),
    ] {
        for dist in DISTS {
            let mut scores: Vec<f32> = (0..rows).flat_map(|_| draw(&mut rng, dist, n)).collect();
            if n > 10 {
                scores[3] = f32::NEG_INFINITY;
                scores[n + 5] = f32::INFINITY;
            }
            let d_scores = dev.stream.clone_htod(&scores).unwrap();
            let mut out = dev.stream.alloc_zeros::<u32>(rows * k).unwrap();
            for tol in [0.0f32, 0.03, 0.2] {
                let kk = topk
                    .launch(&dev, &d_scores, rows, n, k, tol, &mut out)
                    .unwrap();
                let got = dev.stream.clone_dtoh(&out).unwrap();
                for r in 0..rows {
                    let want = sort_topk(&scores[r * n..][..n], kk);
                    let g = &got[r * kk..][..kk];
                    let hits = check(g, &want, n);
                    if tol <= 0.0 {
                        assert_eq!(g, &want[..], "exact {dist} n {n} k {k} row {r}");
                    } else {
                        assert!(
                            hits >= required(kk, tol),
                            "{dist} n {n} k {k} tol {tol}: {hits} of {kk}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
#[ignore]
fn gpu_topk_speed() {
    let Some(dev) = common::device_or_skip("gpu_topk_speed") else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(7);
    let topk = GpuTopk::new(&dev).unwrap();
    let tol = 0.03f32;
    const GROUP: usize = 20;
    println!(
        "top-k, k = n / 16 - 2, tolerance {tol}: median of 50 groups of {GROUP} launches, per launch"
    );
    println!(
        "{:>5} {:>6} {:>5} {:>11} {:>9} {:>10} {:>8} {:>11}",
        "rows", "n", "k", "scores", "exact us", "approx us", "speedup", "recall min"
    );
    // 128 rows: batch 16 of 8 KV heads, one block a multiprocessor. 1024: a step of many
    // sequences, where blocks queue for multiprocessors and throughput decides.
    for (rows, n) in [
        (128, 2048usize),
        (128, 8192),
        (128, 32_768),
        (1024, 8192),
        (1024, 32_768),
    ] {
        let k = n / 16 - 2;
        for dist in &DISTS[..4] {
            // Several score sets in turn, so that repeated runs do not all hit one cached set.
            let sets: Vec<Vec<f32>> = (0..4)
                .map(|_| (0..rows).flat_map(|_| draw(&mut rng, dist, n)).collect())
                .collect();
            let d: Vec<_> = sets
                .iter()
                .map(|s| dev.stream.clone_htod(s).unwrap())
                .collect();
            let mut out = dev.stream.alloc_zeros::<u32>(rows * k).unwrap();
            let mut time = |t: f32| {
                let mut i = 0;
                let ms = time_runs(&dev, 2, 50, || {
                    for _ in 0..GROUP {
                        i += 1;
                        topk.launch(&dev, &d[i % d.len()], rows, n, k, t, &mut out)?;
                    }
                    Ok(())
                })
                .unwrap();
                median(&ms) * 1e3 / GROUP as f64
            };
            let (exact, approx) = (time(0.0), time(tol));
            topk.launch(&dev, &d[0], rows, n, k, tol, &mut out).unwrap();
            let got = dev.stream.clone_dtoh(&out).unwrap();
            let recall = (0..rows)
                .map(|r| {
                    let want = sort_topk(&sets[0][r * n..][..n], k);
                    check(&got[r * k..][..k], &want, n) as f64 / k as f64
                })
                .fold(1.0f64, f64::min);
            println!(
                "{rows:>5} {n:>6} {k:>5} {dist:>11} {exact:>9.1} {approx:>10.1} {:>7.2}x {recall:>11.4}",
                exact / approx
            );
        }
    }
}
