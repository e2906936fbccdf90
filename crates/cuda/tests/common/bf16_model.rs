//! Models whose matrices are exactly representable in bf16, so that the GPU's bf16 copy is the
//! same model as the CPU's; and their matrices as the GPU's fp8 weights hold them.

use std::sync::Arc;

use half::bf16;
use vortex_kernels::quant::GgmlType;
use vortex_model::model::Model;
use vortex_model::weights::{Bytes, Weight};

/// `v` with every value rounded to the nearest bf16.
pub fn round(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect()
}

fn weight(w: &Weight) -> Weight {
    f32_weight(w, &round(&w.to_f32()))
}

fn f32_weight(w: &Weight, values: &[f32]) -> Weight {
    let data: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
    Weight {
        ty: GgmlType::F32,
        rows: w.rows,
        cols: w.cols,
        bytes: Bytes::Owned(Arc::new(data)),
    }
}

/// `w` quantized to fp8 a row at a time as the GPU quantizes it, and widened back.
#[allow(dead_code)] // not every test that shares this file runs fp8 weights
fn fp8_weight(w: &Weight) -> Weight {
    let v = w.to_f32();
    let values: Vec<f32> = v
        .chunks(w.cols)
        .flat_map(|row| {
            let (scale, bytes) = vortex_cuda::fp8::quantize_row(row);
            bytes
                .into_iter()
                .map(move |b| vortex_cuda::fp8::to_f32(b) * scale)
        })
        .collect();
    f32_weight(w, &values)
}

/// The model the GPU runs after `use_fp8_weights` on `m` (whose matrices are bf16 values): every
/// matrix a step multiplies by as fp8, the embedding as it is (a tied output projection becomes
/// an fp8 copy of it).
#[allow(dead_code)]
pub fn fp8_model(m: &Model) -> Model {
    let layers = m
        .layers
        .iter()
        .map(|l| l.map_matrices(fp8_weight))
        .collect();
    let head = m.lm_head.as_ref().unwrap_or(&m.embed);
    Model::new(
        m.config.clone(),
        m.embed.clone(),
        layers,
        m.norm.clone(),
        Some(fp8_weight(head)),
    )
}

/// `m` with every matrix rounded to bf16 (norms, biases and the configuration as they are).
pub fn bf16_model(m: &Model) -> Model {
    let layers = m.layers.iter().map(|l| l.map_matrices(weight)).collect();
    Model::new(
        m.config.clone(),
        weight(&m.embed),
        layers,
        m.norm.clone(),
        m.lm_head.as_ref().map(weight),
    )
}
