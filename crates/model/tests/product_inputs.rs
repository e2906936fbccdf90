//! A model whose products take their input rows rounded to bf16 (as a GPU's bf16 products do)
//! computes the same function to bf16's precision, and the rounding does take effect.

use vortex_flow::runner::FlowRunner;
use vortex_flow::{Geometry, Settings};
use vortex_kv::{KvCache, KvDtype, KvGeometry, Sequence};
use vortex_model::model::{KvState, Model, SeqStep};
use vortex_model::random::{random_weights, tiny_config};

/// The logits after a prompt of 21 tokens and after each of three decode steps.
fn logits(model: &Model) -> Vec<Vec<f32>> {
    let c = &model.config;
    let g = Geometry {
        heads_q: c.heads_q,
        heads_kv: c.heads_kv,
        head_dim: c.head_dim,
        page_size: 4,
    };
    let flow = vortex_flow::library::load("dense", g).unwrap();
    let geom = KvGeometry::new(c.heads_kv, c.head_dim, 4).unwrap();
    let mut kv = KvState::new(
        KvCache::new(geom, KvDtype::Bf16, c.layers, 64),
        FlowRunner::new(flow),
    );
    let mut seq = Sequence::default();
    let mut state = kv.flow.new_state(c.layers);
    let settings = Settings::default();
    let prompt: Vec<u32> = (0..21).map(|i| (i * 37 + 5) % c.vocab as u32).collect();
    let chunks = [&prompt[..], &[3], &[17], &[40]];
    chunks
        .iter()
        .map(|tokens| {
            let mut step = [SeqStep {
                seq: &mut seq,
                state: &mut state,
                settings: &settings,
                tokens,
            }];
            model.forward(&mut kv, &mut step).unwrap().pop().unwrap()
        })
        .collect()
}

#[test]
fn bf16_product_inputs_move_the_logits_by_bf16_precision() {
    let f32_inputs = random_weights(tiny_config(), 11);
    let bf16_inputs = f32_inputs.clone().with_bf16_product_inputs();
    for (a, b) in logits(&f32_inputs).iter().zip(logits(&bf16_inputs)) {
        let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
        let diff = a
            .iter()
            .zip(&b)
            .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(diff > 0.0, "the rounding changed nothing");
        assert!(
            diff < 2e-2 * scale,
            "logits differ by {diff} (largest {scale})"
        );
    }
}
