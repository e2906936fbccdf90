//! Float weight matrices quantized to Q8_0 when a model loads (`--weight-dtype q8_0` on the CPU):
//! a Hugging Face folder's bf16 matrices, or a GGUF file's F16/BF16/F32 ones, then take the
//! quantized products (and their row groups), reading about half the bytes of bf16 a token.
//! Each block of 32 values is quantized as llama.cpp's reference quantizer does: `d = max|x| /
//! 127` (stored as f16), `q = round(x / d)`, so a value moves by at most about `d / 2`.

use std::sync::Arc;

use half::f16;
use rayon::prelude::*;
use vortex_kernels::quant::{GgmlType, QK, QMatrix, RowGroups};

use crate::model::Model;
use crate::weights::{Bytes, Weight};

/// Bytes of a Q8_0 block: its f16 scale, then 32 signed values.
const BLOCK_BYTES: usize = 2 + QK;

/// Whether `w` is a float matrix whose rows split into blocks of 32.
fn quantizable(w: &Weight) -> bool {
    matches!(w.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) && w.cols.is_multiple_of(QK)
}

/// `w` as Q8_0 where it is a float matrix with rows of whole blocks; otherwise `w` itself.
/// Where this CPU's products read row groups and every row falls in one, the weight is held in
/// its groups alone, about 1.06 bytes a weight.
pub fn q8_0(w: &Weight) -> Weight {
    if !quantizable(w) {
        return w.clone();
    }
    let blocks = w.cols / QK;
    let mut out = vec![0u8; w.rows * blocks * BLOCK_BYTES];
    out.par_chunks_mut(blocks * BLOCK_BYTES)
        .enumerate()
        .for_each_init(
            || vec![0f32; w.cols],
            |row, (r, dst)| {
                w.row(r, row);
                for (x, b) in row.chunks_exact(QK).zip(dst.chunks_exact_mut(BLOCK_BYTES)) {
                    quantize_block(x, b);
                }
            },
        );
    let flat = QMatrix::new(GgmlType::Q8_0, w.rows, w.cols, &out).expect("whole Q8_0 rows");
    match RowGroups::new(&flat) {
        Some(groups) if groups.rows() == w.rows => Weight::from_groups(groups),
        _ => Weight::new(GgmlType::Q8_0, w.rows, w.cols, Bytes::Owned(Arc::new(out))),
    }
}

/// One block of 32 values into `out` (34 bytes).
fn quantize_block(x: &[f32], out: &mut [u8]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    for (q, &v) in out[2..].iter_mut().zip(x) {
        *q = (v * id).round() as i8 as u8;
    }
}

/// `m` with every float matrix quantized to Q8_0 (the embedding and the output projection too),
/// each layer's float copy dropped as soon as it is converted.
pub fn q8_0_model(m: Model) -> Model {
    let Model {
        config,
        embed,
        layers,
        norm,
        lm_head,
        ..
    } = m;
    let layers = layers.into_iter().map(|l| l.map_matrices(q8_0)).collect();
    let lm_head = lm_head.map(|w| q8_0(&w));
    Model::new(config, q8_0(&embed), layers, norm, lm_head)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::{random_weights, tiny_config};

    fn f32_weight(rows: usize, cols: usize, values: &[f32]) -> Weight {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Weight::new(GgmlType::F32, rows, cols, Bytes::Owned(Arc::new(bytes)))
    }

    #[test]
    fn blocks_are_llama_cpp_reference_blocks() {
        // Largest magnitude 2.54: d = 0.02, so 2.54 -> 127, -0.031 -> -1.55 -> -2, 0.013 ->
        // 0.65 -> 1; an all-zero block -> d 0 and zeros.
        let mut v = vec![0f32; 64];
        v[0] = 2.54;
        v[1] = -0.031;
        v[2] = 0.013;
        v[3] = -2.54;
        let q = q8_0(&f32_weight(1, 64, &v));
        assert_eq!(q.ty, GgmlType::Q8_0);
        let b = q.bytes.as_slice();
        assert_eq!(b.len(), 2 * BLOCK_BYTES);
        assert_eq!(
            f16::from_le_bytes([b[0], b[1]]),
            f16::from_f32(2.54 / 127.0)
        );
        assert_eq!(&b[2..6], &[127u8, (-2i8) as u8, 1, (-127i8) as u8]);
        assert!(b[6..BLOCK_BYTES].iter().all(|&x| x == 0));
        assert!(b[BLOCK_BYTES..].iter().all(|&x| x == 0));
    }

    #[test]
    fn values_move_by_half_a_step_at_most() {
        let m = random_weights(tiny_config(), 5);
        let w = &m.layers[1].down;
        let q = q8_0(w);
        let (x, y) = (w.to_f32(), q.to_f32());
        for (xb, yb) in x.chunks(QK).zip(y.chunks(QK)) {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            // Half a step, plus the step's own rounding to f16 times the largest value.
            let bound = amax / 127.0 / 2.0 + amax / 1024.0;
            for (a, b) in xb.iter().zip(yb) {
                assert!((a - b).abs() <= bound, "{a} -> {b}, bound {bound}");
            }
        }
    }

    #[test]
    fn only_float_matrices_of_whole_blocks_change() {
        let odd = f32_weight(2, 40, &[0.5; 80]);
        assert_eq!(q8_0(&odd).ty, GgmlType::F32);
        let m = random_weights(tiny_config(), 9);
        let q = q8_0(&m.layers[0].wq);
        assert_eq!(q8_0(&q).to_f32(), q.to_f32());
        // Held in its groups alone where this CPU's products read groups (all 64 rows grouped).
        let grouped =
            vortex_kernels::quant::Isa::detect().level() != vortex_kernels::quant::IsaLevel::Scalar;
        assert_eq!(matches!(q.bytes, Bytes::Grouped), grouped);
        let before = m.weight_bytes();
        let converted = q8_0_model(m);
        let after = converted.weight_bytes();
        // f32 to 34 bytes a block of 32: 128 / 34 = 3.76 times fewer (whole 64-byte lines here).
        assert_eq!(
            before * BLOCK_BYTES,
            after * 4 * QK,
            "{before} bytes against {after}"
        );
        let layer = &converted.layers[0];
        for w in [
            &converted.embed,
            &layer.wq,
            &layer.wk,
            &layer.wv,
            &layer.wo,
            &layer.gate,
        ] {
            assert_eq!(w.ty, GgmlType::Q8_0);
        }
    }
}
