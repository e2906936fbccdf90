//! A model whose products take their input rows rounded to bf16 (as a GPU's bf16 products do)
//! computes the same function to bf16's precision, and the rounding does take effect.

mod logits_support;

use vortex_kv::KvDtype;
use vortex_model::model::Model;
use vortex_model::random::{random_weights, tiny_config};

/// The logits after a prompt of 21 tokens and after each of three decode steps.
fn logits(model: &Model) -> Vec<Vec<f32>> {
    let vocab = model.config.vocab as u32;
    let prompt: Vec<u32> = (0..21).map(|i| (i * 37 + 5) % vocab).collect();
    logits_support::logits(model, &[&prompt, &[3], &[17], &[40]], KvDtype::Bf16)
}

#[test]
fn bf16_product_inputs_move_the_logits_by_bf16_precision() {
    let f32_inputs = random_weights(tiny_config(), 11);
    let bf16_inputs = f32_inputs.clone().with_bf16_product_inputs();
    for (a, b) in logits(&f32_inputs).iter().zip(logits(&bf16_inputs)) {
        assert!(a.iter().chain(&b).all(|x| x.is_finite()));
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
