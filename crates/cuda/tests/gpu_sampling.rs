//! Tokens chosen on the GPU against the host's definition of each cut, on fresh random logits:
//! draws over 4000 seeds follow the softmax of exactly the tokens that top-k, top-p and min-p
//! keep (ties by id, logits that are not finite never drawn), and the same seed draws the same
//! token. Skips visibly without a GPU.

mod common;

use rand::{Rng, SeedableRng, rngs::StdRng};
use vortex_cuda::sampling::{Draws, Masks, SamplingKernels};
use vortex_model::sampling::DeviceDraw;

const DRAWS: u64 = 4000;

/// The host's ranking: best logit first, the lower id first among equals (-0 as +0).
fn ranking(logits: &[f32]) -> Vec<usize> {
    let mut ids: Vec<usize> = (0..logits.len())
        .filter(|&i| logits[i].is_finite())
        .collect();
    ids.sort_by(|&a, &b| {
        (logits[b] + 0.0)
            .total_cmp(&(logits[a] + 0.0))
            .then(a.cmp(&b))
    });
    ids
}

/// Each token's probability under `d`, in f64, as `SamplingParams` defines the cuts; `None` when
/// a top-p or min-p boundary lies so close to a token that rounding could decide it (the caller
/// then moves the cut).
fn reference(logits: &[f32], d: &DeviceDraw) -> Option<Vec<f64>> {
    let mut ranked = ranking(logits);
    if d.top_k > 0 {
        ranked.truncate(d.top_k);
    }
    let best = f64::from(logits[ranked[0]]);
    let w: Vec<f64> = ranked
        .iter()
        .map(|&i| ((f64::from(logits[i]) - best) / f64::from(d.temperature)).exp())
        .collect();
    let total: f64 = w.iter().sum();
    let mut keep = ranked.len();
    if d.min_p > 0.0 {
        let min_p = f64::from(d.min_p);
        if w.iter().any(|&x| (x - min_p).abs() < 1e-5) {
            return None;
        }
        keep = keep.min(w.iter().take_while(|&&x| x >= min_p).count());
    }
    if d.top_p < 1.0 {
        let top_p = f64::from(d.top_p);
        let mut before = 0.0;
        let mut n = 0;
        for &x in &w {
            if ((before / total) - top_p).abs() < 1e-5 {
                return None;
            }
            if before / total >= top_p {
                break;
            }
            before += x;
            n += 1;
        }
        keep = keep.min(n);
    }
    let kept: f64 = w[..keep].iter().sum();
    let mut p = vec![0.0; logits.len()];
    for (&i, &x) in ranked[..keep].iter().zip(&w) {
        p[i] = x / kept;
    }
    Some(p)
}

/// The cut with its boundaries moved until none is ambiguous.
fn settled(logits: &[f32], mut d: DeviceDraw) -> (DeviceDraw, Vec<f64>) {
    for _ in 0..100 {
        if let Some(p) = reference(logits, &d) {
            return (d, p);
        }
        if d.top_p < 1.0 {
            d.top_p = (d.top_p + 0.003).min(0.999);
        }
        if d.min_p > 0.0 {
            d.min_p *= 1.01;
        }
    }
    panic!("no unambiguous cut near {d:?}");
}

/// Rows of fresh logits: normal with standard deviation `spread`, the same shifted with
/// non-finite entries, and coarse values with many exact ties.
fn rows(rng: &mut StdRng, vocab: usize, spread: f32) -> Vec<Vec<f32>> {
    let normal = |rng: &mut StdRng| {
        // Box-Muller from two uniforms.
        let (u, v): (f64, f64) = (rng.random_range(1e-12..1.0), rng.random());
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    };
    let plain: Vec<f32> = (0..vocab).map(|_| spread * normal(rng)).collect();
    let mut odd: Vec<f32> = (0..vocab).map(|_| spread * normal(rng) + 5.0).collect();
    // Not at id 0: the host's argmax of a row starting with NaN is 0.
    for (i, x) in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY]
        .into_iter()
        .enumerate()
    {
        for j in 0..3 {
            odd[1 + (i * 7 + j * 131) % (vocab - 1)] = x;
        }
    }
    let ties: Vec<f32> = (0..vocab)
        .map(|_| (2.0 * spread * normal(rng)).round() / 2.0)
        .collect();
    vec![plain, odd, ties]
}

#[test]
fn gpu_draws_keep_what_the_cuts_keep() {
    let Some(dev) = common::device_or_skip("gpu_draws_keep_what_the_cuts_keep") else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(common::test_seed());
    let kernels = SamplingKernels::new(&dev).unwrap();
    let cut = |temperature, top_k, top_p, min_p| DeviceDraw {
        temperature,
        top_k,
        top_p,
        min_p,
        seed: 0,
    };
    let cuts = [
        cut(1.0, 0, 0.9, 0.0),
        cut(0.7, 20, 1.0, 0.0),
        cut(1.5, 0, 1.0, 0.05),
        cut(1.0, 50, 0.8, 0.02),
        cut(1.0, 7, 0.5, 0.0),
        cut(2.0, 0, 0.3, 0.0),
        cut(1.0, 1, 1.0, 0.0),
        cut(0.5, 1 << 40, 0.95, 0.0),
    ];
    // A small vocabulary through every cut; Qwen3's, with logits spread so that the kept
    // tokens are few enough to count, through three.
    for (vocab, spread, cuts) in [(1000, 3.0, &cuts[..]), (151_936, 6.0, &cuts[3..6])] {
        let rows = rows(&mut rng, vocab, spread);
        let flat: Vec<f32> = rows.concat();
        let logits = dev.stream.clone_htod(&flat).unwrap();
        let mut draws = Draws::default();
        let mut out = dev.stream.alloc_zeros::<u32>(DRAWS as usize).unwrap();
        for (r, row) in rows.iter().enumerate() {
            for &c in cuts {
                let (c, want) = settled(row, c);
                let picks: Vec<(usize, DeviceDraw)> = (0..DRAWS)
                    .map(|s| {
                        let seed = s.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ rng.random::<u64>();
                        (r, DeviceDraw { seed, ..c })
                    })
                    .collect();
                let mut run = |picks: &[(usize, DeviceDraw)]| {
                    draws.load(&dev, picks).unwrap();
                    kernels
                        .draw(&dev, &logits, rows.len(), vocab, &draws, &mut out)
                        .unwrap();
                    dev.stream.clone_dtoh(&out.slice(..picks.len())).unwrap()
                };
                let ids = run(&picks);
                assert_eq!(
                    ids[..100],
                    run(&picks[..100]),
                    "the same seeds draw the same"
                );
                let mut counts = vec![0u64; vocab];
                for &id in &ids {
                    assert!(
                        want[id as usize] > 0.0,
                        "vocab {vocab}, row {r}, {c:?}: drew token {id} ({}), which the cuts drop",
                        row[id as usize]
                    );
                    counts[id as usize] += 1;
                }
                for (i, (&n, &p)) in counts.iter().zip(&want).enumerate() {
                    let got = n as f64 / DRAWS as f64;
                    let sd = (p * (1.0 - p) / DRAWS as f64).sqrt();
                    assert!(
                        (got - p).abs() <= 4.5 * sd + 0.002,
                        "vocab {vocab}, row {r}, {c:?}, token {i}: drawn {got:.4}, kept softmax \
                         {p:.4}"
                    );
                }
            }
        }
    }
}

/// At temperature 0 the row's argmax, whatever the cuts; rows out of the logits are refused.
#[test]
fn gpu_draws_at_temperature_zero_take_the_argmax() {
    let Some(dev) = common::device_or_skip("gpu_draws_at_temperature_zero_take_the_argmax") else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(common::test_seed());
    let kernels = SamplingKernels::new(&dev).unwrap();
    let vocab = 5000;
    let rows = rows(&mut rng, vocab, 3.0);
    let logits = dev.stream.clone_htod(&rows.concat()).unwrap();
    let mut draws = Draws::default();
    let mut out = dev.stream.alloc_zeros::<u32>(rows.len()).unwrap();
    let greedy = DeviceDraw {
        top_k: 3,
        top_p: 0.5,
        ..DeviceDraw::ARGMAX
    };
    let picks: Vec<(usize, DeviceDraw)> = (0..rows.len()).map(|r| (r, greedy)).collect();
    draws.load(&dev, &picks).unwrap();
    kernels
        .draw(&dev, &logits, rows.len(), vocab, &draws, &mut out)
        .unwrap();
    let got = dev.stream.clone_dtoh(&out).unwrap();
    for (row, id) in rows.iter().zip(got) {
        assert_eq!(id, vortex_model::sampling::argmax(row));
    }
    draws.load(&dev, &[(rows.len(), greedy)]).unwrap();
    assert!(
        kernels
            .draw(&dev, &logits, rows.len(), vocab, &draws, &mut out)
            .is_err()
    );
    let bad = DeviceDraw {
        top_p: 0.0,
        ..DeviceDraw::plain(1.0, 0)
    };
    assert!(draws.load(&dev, &[(0, bad)]).is_err());
}

/// Rows held to token sets (a grammar's next tokens): the masked logits are the host's (-inf
/// outside the set), the argmax is the best allowed token, and draws at a temperature with
/// cuts pick only allowed tokens; a mask of the wrong width or row is refused.
#[test]
fn gpu_masks_hold_rows_to_their_token_sets() {
    let Some(dev) = common::device_or_skip("gpu_masks_hold_rows_to_their_token_sets") else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(common::test_seed());
    let kernels = SamplingKernels::new(&dev).unwrap();
    let vocab = 151_936;
    let rows = rows(&mut rng, vocab, 3.0);
    let words = vocab.div_ceil(64);
    // Row 2: about 5% of the tokens; row 0: one token; row 1 free.
    let mut sparse = vec![0u64; words];
    for i in 0..vocab {
        if rng.random::<f32>() < 0.05 {
            sparse[i / 64] |= 1 << (i % 64);
        }
    }
    let only = rng.random_range(0..vocab);
    let mut single = vec![0u64; words];
    single[only / 64] |= 1 << (only % 64);
    let sets = [(2, sparse.as_slice()), (0, single.as_slice())];
    let mut logits = dev.stream.clone_htod(&rows.concat()).unwrap();
    let mut masks = Masks::default();
    masks.load(&dev, vocab, &sets).unwrap();
    kernels
        .mask(&dev, &mut logits, rows.len(), vocab, &masks)
        .unwrap();
    let got = dev.stream.clone_dtoh(&logits).unwrap();
    let allowed = |set: &[u64], i: usize| set[i / 64] >> (i % 64) & 1 == 1;
    let mut want = rows.clone();
    for &(r, set) in &sets {
        for (i, l) in want[r].iter_mut().enumerate() {
            if !allowed(set, i) {
                *l = f32::NEG_INFINITY;
            }
        }
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (r, (g, w)) in got.chunks(vocab).zip(&want).enumerate() {
        assert!(bits(g) == bits(w), "row {r}'s masked logits");
    }
    let mut draws = Draws::default();
    let mut out = dev.stream.alloc_zeros::<u32>(256).unwrap();
    let argmax: Vec<(usize, DeviceDraw)> =
        (0..rows.len()).map(|r| (r, DeviceDraw::ARGMAX)).collect();
    draws.load(&dev, &argmax).unwrap();
    kernels
        .draw(&dev, &logits, rows.len(), vocab, &draws, &mut out)
        .unwrap();
    let ids = dev.stream.clone_dtoh(&out).unwrap();
    for r in 0..rows.len() {
        assert_eq!(ids[r], vortex_model::sampling::argmax(&want[r]), "row {r}");
    }
    assert_eq!(ids[0] as usize, only);
    let draw = |seed| DeviceDraw {
        top_p: 0.9,
        top_k: 50,
        ..DeviceDraw::plain(1.5, seed)
    };
    let picks: Vec<(usize, DeviceDraw)> = (0..256).map(|s| (2 * (s % 2), draw(s as u64))).collect();
    draws.load(&dev, &picks).unwrap();
    kernels
        .draw(&dev, &logits, rows.len(), vocab, &draws, &mut out)
        .unwrap();
    let ids = dev.stream.clone_dtoh(&out).unwrap();
    for ((r, _), id) in picks.iter().zip(ids) {
        let set = if *r == 2 { &sparse } else { &single };
        assert!(allowed(set, id as usize), "row {r} drew {id}");
    }
    assert!(masks.load(&dev, vocab - 64, &sets).is_err());
    masks
        .load(&dev, vocab, &[(rows.len(), sparse.as_slice())])
        .unwrap();
    assert!(
        kernels
            .mask(&dev, &mut logits, rows.len(), vocab, &masks)
            .is_err()
    );
}

/// Device time of choosing 16 tokens from Qwen3's vocabulary, each way (`--ignored`): the
/// median of 50 launches, and the bytes of one read of the logits over it.
#[test]
#[ignore]
fn gpu_sampling_speed() {
    let Some(dev) = common::device_or_skip("gpu_sampling_speed") else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(1);
    let kernels = SamplingKernels::new(&dev).unwrap();
    let (vocab, batch) = (151_936, 16);
    let flat: Vec<f32> = (0..batch)
        .flat_map(|_| rows(&mut rng, vocab, 2.0).swap_remove(0))
        .collect();
    let logits = dev.stream.clone_htod(&flat).unwrap();
    let mut out = dev.stream.alloc_zeros::<u32>(batch).unwrap();
    let mut draws = Draws::default();
    let plain = DeviceDraw::plain(0.7, 1);
    let ways = [
        ("argmax", DeviceDraw::ARGMAX),
        ("temperature 0.7", plain),
        (
            "top-p 0.9",
            DeviceDraw {
                top_p: 0.9,
                ..plain
            },
        ),
        ("top-k 50", DeviceDraw { top_k: 50, ..plain }),
        (
            "min-p 0.05",
            DeviceDraw {
                min_p: 0.05,
                ..plain
            },
        ),
        (
            "top-k 50, top-p 0.8, min-p 0.02",
            DeviceDraw {
                top_k: 50,
                top_p: 0.8,
                min_p: 0.02,
                ..plain
            },
        ),
    ];
    let bytes = batch * vocab * 4;
    let gb_per_s = vortex_cuda::timing::copy_bandwidth(&dev, 1 << 30, 20).unwrap();
    println!("| {batch} rows of {vocab} logits | us (median of 50) |");
    println!("|---|---|");
    for (name, d) in ways {
        let picks: Vec<(usize, DeviceDraw)> = (0..batch).map(|r| (r, d)).collect();
        draws.load(&dev, &picks).unwrap();
        let ms = vortex_cuda::timing::time_runs(&dev, 5, 50, || {
            kernels.draw(&dev, &logits, batch, vocab, &draws, &mut out)
        })
        .unwrap();
        println!("| {name} | {:.1} |", vortex_cuda::timing::median(&ms) * 1e3);
    }
    println!(
        "(one read of the {:.1} MB of logits at the measured copy bandwidth, {gb_per_s:.0} GB/s: \
         {:.1} us)",
        bytes as f64 / 1e6,
        bytes as f64 / gb_per_s * 1e-3
    );
}
