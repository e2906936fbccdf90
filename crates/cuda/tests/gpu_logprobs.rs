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
