//! The values a GPU multiplies by, as CPU weights: each matrix rounded to bf16 (the GPU's copy
//! of a model), and with `--weight-dtype fp8` quantized a row at a time to e4m3 with a scale and
//! widened back to f32. The CPU then computes with exactly the GPU's weights, so that what the
//! rounding costs can be measured where no GPU is (`vortex eval --weight-dtype fp8`).

use std::sync::Arc;

use half::bf16;
use vortex_kernels::quant::GgmlType;

use crate::model::Model;
use crate::weights::{Bytes, Weight};

/// `values` (`w`'s shape) as an f32 weight.
fn f32_weight(w: &Weight, values: &[f32]) -> Weight {
    Weight::new(
        GgmlType::F32,
        w.rows,
        w.cols,
        Bytes::Owned(Arc::new(
            values.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )),
    )
}

/// `w`'s values rounded to bf16.
pub fn bf16_values(w: &Weight) -> Weight {
    let v: Vec<f32> = w
        .to_f32()
        .iter()
        .map(|&x| bf16::from_f32(x).to_f32())
        .collect();
    f32_weight(w, &v)
}

/// `w`'s values rounded to bf16, then a row at a time to e4m3 with the row's scale, as the GPU
/// quantizes its bf16 copy.
pub fn fp8_values(w: &Weight) -> Weight {
    let v: Vec<f32> = bf16_values(w)
        .to_f32()
        .chunks(w.cols)
        .flat_map(|row| {
            let (scale, bytes) = vortex_kv::fp8::quantize_row(row);
            bytes
                .into_iter()
                .map(move |b| vortex_kv::fp8::to_f32(b) * scale)
        })
        .collect();
    f32_weight(w, &v)
}

/// The model a GPU runs with `--weight-dtype fp8`: every matrix a step multiplies by (the output
/// projection too, tied or not) as fp8 values, the embedding lookup in bf16.
pub fn fp8_model(m: &Model) -> Model {
    let layers = m
        .layers
        .iter()
        .map(|l| l.map_matrices(fp8_values))
        .collect();
    let head = fp8_values(m.lm_head.as_ref().unwrap_or(&m.embed));
    Model::new(
        m.config.clone(),
        bf16_values(&m.embed),
        layers,
        m.norm.clone(),
        Some(head),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::{random_weights, tiny_config};

    #[test]
    fn fp8_values_are_the_rows_quantized_as_the_gpu_does() {
        let m = random_weights(tiny_config(), 3);
        let w = &m.layers[0].gate;
        let (bf, fp) = (bf16_values(w).to_f32(), fp8_values(w).to_f32());
        assert!(bf.iter().all(|&x| bf16::from_f32(x).to_f32() == x));
        for (r, (brow, frow)) in bf.chunks(w.cols).zip(fp.chunks(w.cols)).enumerate() {
            let (scale, bytes) = vortex_kv::fp8::quantize_row(brow);
            let max = brow.iter().fold(0f32, |a, &x| a.max(x.abs()));
            for (i, (&b, &f)) in brow.iter().zip(frow).enumerate() {
                assert_eq!(
                    f,
                    vortex_kv::fp8::to_f32(bytes[i]) * scale,
                    "row {r} col {i}"
                );
                // e4m3: 3 mantissa bits, subnormals below 2^-6 of the scaled range.
                assert!((f - b).abs() <= b.abs() / 16.0 + max / 448.0 / 512.0 + 1e-30);
            }
        }
    }

    #[test]
    fn an_fp8_model_has_its_own_output_projection() {
        let mut c = tiny_config();
        c.tied_embeddings = true;
        let m = random_weights(c, 5);
        let f = fp8_model(&m);
        let head = f
            .lm_head
            .as_ref()
            .expect("an fp8 copy of the tied embedding");
        assert_eq!(head.to_f32(), fp8_values(&m.embed).to_f32());
        assert_eq!(f.embed.to_f32(), bf16_values(&m.embed).to_f32());
        assert_eq!(f.norm, m.norm);
        assert_eq!(
            f.layers[1].down.to_f32(),
            fp8_values(&m.layers[1].down).to_f32()
        );
    }
}
