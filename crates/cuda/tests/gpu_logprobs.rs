//! Log-probabilities on the GPU against the host's (`vortex_engine::request::token_logprob`),
//! on fresh random rows with ties and a masked row: each row's best tokens and the drawn
//! token's log-probability. Skips visibly without a GPU.

mod common;

use rand::{Rng, SeedableRng, rngs::StdRng};
use vortex_cuda::logprobs::{LogprobKernels, RowLogprobs};
use vortex_engine::request::token_logprob;

#[test]
fn gpu_logprobs_match_the_hosts() {
    let Some(dev) = common::device_or_skip("gpu_logprobs_match_the_hosts") else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(5);
    let vocab = 151_936;
    let rows = 6;
    let mut logits: Vec<f32> = (0..rows * vocab)
        .map(|_| (rng.random::<f32>() * 2.0 - 1.0) * 12.0)
        .collect();
    // Row 1: ties at the top (lower ids first); row 2: values in a narrow band.
    for i in [70_000, 5, 151_000] {
        logits[vocab + i] = 30.0;
    }
    for x in &mut logits[2 * vocab..3 * vocab] {
        *x = 1.0 + *x * 1e-3;
    }
    let d_logits = dev.stream.clone_htod(&logits).unwrap();
    let k = LogprobKernels::new(&dev).unwrap();
    let mut lp = RowLogprobs::default();
    // Every row but 4, in another order, 20 best each.
    let order = [3usize, 0, 5, 1, 2];
    lp.queue(&dev, &k, &d_logits, vocab, &order, 20).unwrap();
    // Picks: some token of each row, stored in another order.
    let chosen: Vec<u32> = order
        .iter()
        .map(|_| rng.random_range(0..vocab as u32))
        .collect();
    let picks_host: Vec<u32> = chosen.iter().rev().copied().collect();
    let picks = dev.stream.clone_htod(&picks_host).unwrap();
    let pick_of: Vec<usize> = (0..order.len()).map(|j| order.len() - 1 - j).collect();
    let got = lp
        .finish(&dev, &k, &d_logits, vocab, &picks, &pick_of)
        .unwrap();
    assert_eq!(got.len(), order.len());
    for (j, &r) in order.iter().enumerate() {
        let row = &logits[r * vocab..(r + 1) * vocab];
        let want = token_logprob(row, chosen[j], 20);
        let g = &got[j];
        assert!(
            (g.token - want.logprob).abs() < 1e-4,
            "row {r}: {} vs {}",
            g.token,
            want.logprob
        );
        let ids: Vec<u32> = g.top.iter().map(|t| t.0).collect();
        let want_ids: Vec<u32> = want.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, want_ids, "row {r}");
        for (a, b) in g.top.iter().zip(&want.top) {
            assert!((a.1 - b.1).abs() < 1e-4, "row {r}: {a:?} vs {b:?}");
        }
    }
    assert_eq!(
        &got[3].top[..3].iter().map(|t| t.0).collect::<Vec<_>>(),
        &[5, 70_000, 151_000]
    );
    // No best tokens asked: the drawn token's alone.
    lp.queue(&dev, &k, &d_logits, vocab, &[4], 0).unwrap();
    let got = lp.finish(&dev, &k, &d_logits, vocab, &picks, &[0]).unwrap();
    let want = token_logprob(&logits[4 * vocab..5 * vocab], picks_host[0], 0);
    assert!(got[0].top.is_empty() && (got[0].token - want.logprob).abs() < 1e-4);
    // Rows or picks that do not fit are errors.
    assert!(lp.queue(&dev, &k, &d_logits, vocab, &[rows], 1).is_err());
    lp.queue(&dev, &k, &d_logits, vocab, &[0], 1).unwrap();
    assert!(
        lp.finish(&dev, &k, &d_logits, vocab, &picks, &[99])
            .is_err()
    );
}

/// Milliseconds `f` takes, the median of `runs` runs after one to warm up.
fn median_ms(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let start = std::time::Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[runs / 2]
}

/// A Qwen3-8B-shaped model (random bf16 weights): one prefill pass of a 2048-token prompt,
/// against the log-probabilities of its 2047 prompt rows with 0, 1 and 5 best tokens.
#[test]
#[ignore = "timing; run on a GPU with --ignored --nocapture"]
fn gpu_prompt_scoring_speed() {
    use vortex_cuda::PoolDtype;
    use vortex_cuda::model::{GpuModel, GpuStep, PoolSpec, WeightSource};
    use vortex_flow::Geometry;
    use vortex_flow::library::load;
    use vortex_kv::Sequence;

    let Some(dev) = common::device_or_skip("gpu_prompt_scoring_speed") else {
        return;
    };
    let c = vortex_model::random::geometry("qwen3-8b").unwrap();
    let g = Geometry {
        heads_q: c.heads_q,
        heads_kv: c.heads_kv,
        head_dim: c.head_dim,
        page_size: 16,
    };
    let flow = load("dense", g).unwrap();
    let pool = PoolSpec {
        page_size: 16,
        num_pages: 160,
        dtype: PoolDtype::Bf16,
    };
    let mut gpu = GpuModel::new(dev, c.clone(), WeightSource::Random(1), pool, &flow).unwrap();
    let mut rng = StdRng::seed_from_u64(9);
    let prompt: Vec<u32> = (0..2048)
        .map(|_| rng.random_range(0..c.vocab as u32))
        .collect();
    let pass = |gpu: &mut GpuModel| {
        let mut seq = Sequence::default();
        let mut steps = [GpuStep {
            seq: &mut seq,
            tokens: &prompt,
            state: None,
            flow: 0,
        }];
        gpu.forward(&mut steps).unwrap();
        gpu.logits().unwrap();
        gpu.free(&mut seq);
    };
    let prefill = median_ms(5, || pass(&mut gpu));
    let rows: Vec<usize> = (0..prompt.len() - 1).collect();
    println!(
        "qwen3-8b, random bf16 weights, one pass of {} tokens",
        prompt.len()
    );
    println!("prefill pass and last row's logits: {prefill:.2} ms");
    for top in [0, 1, 5] {
        let ms = median_ms(5, || {
            gpu.score_rows(&rows, &prompt[1..], top).unwrap();
        });
        println!(
            "scores of {} rows, {top} best: {ms:.2} ms ({:.3} ms per 64 rows, {:.2}x the pass)",
            rows.len(),
            ms * 64.0 / rows.len() as f64,
            (prefill + ms) / prefill
        );
    }
}
