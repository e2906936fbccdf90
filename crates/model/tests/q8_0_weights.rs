//! A model whose float matrices were quantized to Q8_0 when loaded computes the same function to
//! 8-bit precision, through the quantized products.

mod logits_support;

use vortex_kv::KvDtype;
use vortex_model::model::Model;
use vortex_model::quantize::q8_0_model;
use vortex_model::random::{random_weights, tiny_config};

/// The logits after a prompt of 21 tokens and after each of three decode steps.
fn logits(model: &Model) -> Vec<Vec<f32>> {
    let vocab = model.config.vocab as u32;
    let prompt: Vec<u32> = (0..21).map(|i| (i * 37 + 5) % vocab).collect();
    logits_support::logits(model, &[&prompt, &[3], &[17], &[40]], KvDtype::Bf16)
}

fn rms(v: impl Iterator<Item = f32>) -> f64 {
    let (sum, n) = v.fold((0f64, 0usize), |(s, n), x| (s + (x as f64).powi(2), n + 1));
    (sum / n as f64).sqrt()
}

/// Q8_0 moves a uniform random weight by about 0.4% of its RMS (a step of a block's largest
/// value / 127), four times bf16's rounding; this two-layer random model's logits then move by
/// 2.0-3.7% of their RMS (1.4-2.5% with the weights' error alone, the rest from the products'
/// 8-bit activations), where rounding the products' inputs to bf16 moves them by 0.6-1.0%.
#[test]
fn q8_0_weights_move_the_logits_by_8_bit_precision() {
    let f32_weights = random_weights(tiny_config(), 21);
    let q8_weights = q8_0_model(f32_weights.clone());
    for (a, b) in logits(&f32_weights).iter().zip(logits(&q8_weights)) {
        assert!(a.iter().chain(&b).all(|x| x.is_finite()));
        let diff = rms(a.iter().zip(&b).map(|(x, y)| x - y));
        let rel = diff / rms(a.iter().copied());
        assert!(diff > 0.0, "the quantization changed nothing");
        assert!(rel < 0.05, "logits moved by {rel} of their RMS");
    }
}
