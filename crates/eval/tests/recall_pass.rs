//! The measuring forward pass of `vortex serve --recall-every`: the CPU model's logits, and in
//! one decode pass of every N the fidelity of its sparse rows, every layer's.

mod common;

use std::sync::{Arc, Mutex};

use vortex_eval::fidelity::Fidelity;
use vortex_eval::recall_pass::RecallPass;
use vortex_kv::Sequence;
use vortex_model::model::{ForwardPass, Next, SeqStep, Wants};

const P: usize = 16;

/// A 400-token prompt and `decodes` single tokens through `pass`, with `flow` at `budget`
/// pages; the logits of each pass.
fn run(pass: &mut dyn ForwardPass, flow: &str, budget: usize, decodes: usize) -> Vec<Vec<f32>> {
    let model = common::tiny_model(7);
    let (mut kv, settings) = common::flow_cache(&model, flow, Some(budget), P, 40);
    let mut seq = Sequence::default();
    let mut state = kv.flow.new_state(model.config.layers);
    let prompt: Vec<u32> = (0..400).map(|i| (i * 37 % 256) as u32).collect();
    let mut out = Vec::new();
    for i in 0..=decodes {
        let tokens = if i == 0 {
            prompt.clone()
        } else {
            vec![65 + i as u32]
        };
        let mut step = [SeqStep {
            seq: &mut seq,
            state: &mut state,
            settings: &settings,
            tokens: &tokens,
        }];
        let next = pass
            .forward(&model, &mut kv, &mut step, &[Wants::Logits])
            .unwrap();
        match &next[..] {
            [Next::Logits(l)] => out.push(l.clone()),
            other => panic!("{other:?}"),
        }
    }
    out
}

#[test]
fn one_decode_pass_in_n_is_measured_and_logits_are_the_models() {
    let seen: Arc<Mutex<Vec<Fidelity>>> = Arc::default();
    let log = seen.clone();
    let mut pass = RecallPass::new(2, Box::new(move |f| log.lock().unwrap().push(*f)));
    let measured = run(&mut pass, "streaming", 3, 5);
    let plain = run(&mut vortex_model::model::CpuPass, "streaming", 3, 5);
    assert_eq!(measured, plain);
    let seen = seen.lock().unwrap();
    // Decode passes 2 and 4 of 5; every layer and KV head of the one sequence is sparse.
    assert_eq!(seen.len(), 2, "{seen:?}");
    for f in seen.iter() {
        assert_eq!(f.rows, 2 * 2, "{f:?}");
        assert!(f.mass_recall > 0.0 && f.mass_recall < 0.9, "{f:?}");
        assert!((0.0..=1.0).contains(&f.topk_recall), "{f:?}");
    }
}

/// Rows that attend to all their pages (a budget covering the sequence) are not measured.
#[test]
fn dense_rows_are_left_out() {
    let seen: Arc<Mutex<Vec<Fidelity>>> = Arc::default();
    let log = seen.clone();
    let mut pass = RecallPass::new(1, Box::new(move |f| log.lock().unwrap().push(*f)));
    run(&mut pass, "block_topk", 1000, 3);
    assert!(seen.lock().unwrap().is_empty());
}
