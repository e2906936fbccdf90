//! Models whose matrices are exactly representable in bf16, so that the GPU's bf16 copy is the
//! same model as the CPU's.

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
    let data: Vec<u8> = round(&w.to_f32())
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    Weight {
        ty: GgmlType::F32,
        rows: w.rows,
        cols: w.cols,
        bytes: Bytes::Owned(Arc::new(data)),
    }
}

/// `m` with every matrix rounded to bf16 (norms, biases and the configuration as they are).
pub fn bf16_model(m: &Model) -> Model {
    let layers = m
        .layers
        .iter()
        .map(|l| {
            let mut l = l.clone();
            for w in [
                &mut l.wq,
                &mut l.wk,
                &mut l.wv,
                &mut l.wo,
                &mut l.gate,
                &mut l.up,
                &mut l.down,
            ] {
                *w = weight(w);
            }
            l
        })
        .collect();
    Model::new(
        m.config.clone(),
        weight(&m.embed),
        layers,
        m.norm.clone(),
        m.lm_head.as_ref().map(weight),
    )
}
