//! Models whose matrices are exactly representable in bf16, so that the GPU's bf16 copy is the
//! same model as the CPU's (their fp8 form: `vortex_model::gpu_values::fp8_model`).

use half::bf16;
use vortex_model::gpu_values::bf16_values;
use vortex_model::model::Model;

/// `v` with every value rounded to the nearest bf16.
#[allow(dead_code)] // not every test that shares this file rounds values of its own
pub fn round(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect()
}

/// `m` with every matrix rounded to bf16 (norms, biases and the configuration as they are), and
/// its products' input rows rounded to bf16 as the GPU's are.
pub fn bf16_model(m: &Model) -> Model {
    let layers = m
        .layers
        .iter()
        .map(|l| l.map_matrices(bf16_values))
        .collect();
    let model = Model::new(
        m.config.clone(),
        bf16_values(&m.embed),
        layers,
        m.norm.clone(),
        m.lm_head.as_ref().map(bf16_values),
    );
    gpu_inputs(model)
}

/// `m` with its products' input rows rounded to bf16, as the GPU's bf16 products take them.
pub fn gpu_inputs(m: Model) -> Model {
    m.with_bf16_product_inputs()
}
