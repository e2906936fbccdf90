//! The engine over a model with sliding-window layers (Gemma 3's layout, a window of 6 tokens,
//! pages of 4): batching, preemption and prefix-cache hits leave greedy outputs as each request
//! gives them alone.

mod common;

use std::sync::Arc;

use common::*;
use tokio::sync::mpsc::unbounded_channel;
use vortex_engine::RequestSpec;
use vortex_model::loader::LoadedModel;

fn gemma() -> Arc<LoadedModel> {
    Arc::new(vortex_model::random::tiny_gemma(7))
}

#[test]
fn batched_and_preempted_outputs_equal_each_request_alone() {
    let m = gemma();
    let specs: Vec<RequestSpec> = (0..4)
        .map(|i| spec(&prompt(20 + i, 9 + 7 * i as usize), 16))
        .collect();
    let alone: Vec<Vec<u32>> = specs.iter().map(|s| run_alone(&m, s.clone())).collect();
    // 16 pages for up to 4 requests of up to 46 tokens (12 pages each): some must wait.
    for (pages, preempts) in [(256, false), (16, true)] {
        let (mut e, metrics) = engine(&m, pages, 4);
        let mut rxs = Vec::new();
        for (i, s) in specs.iter().enumerate() {
            let (tx, rx) = unbounded_channel();
            e.submit(s.clone(), tx);
            rxs.push(rx);
            for _ in 0..i {
                e.step();
            }
        }
        run_all(&mut e);
        assert_eq!(metrics.preemptions() > 0, preempts);
        for (rx, want) in rxs.iter_mut().zip(&alone) {
            assert_eq!(&collect(rx).0, want);
        }
        assert_eq!(metrics.pool().leaked, 0);
    }
}

#[test]
fn prefix_cache_hits_leave_outputs_alone() {
    let m = gemma();
    let shared = prompt(3, 30);
    let mut second = shared.clone();
    second.extend(prompt(4, 5));
    let want = run_alone(&m, spec(&second, 12));
    let (mut e, metrics) = engine(&m, 256, 4);
    let (tx, mut rx) = unbounded_channel();
    e.submit(spec(&shared, 3), tx);
    run_all(&mut e);
    collect(&mut rx);
    let (tx, mut rx) = unbounded_channel();
    e.submit(spec(&second, 12), tx);
    run_all(&mut e);
    let (got, _, cached) = collect(&mut rx);
    assert_eq!(cached, 28, "the shared prompt's 7 complete pages");
    assert!(metrics.prefix_hit_tokens() > 0);
    assert_eq!(got, want);
}
