//! The activations of a product, in the form each weight type's kernels take: f32, 8-bit
//! blocks (32 or 256 elements) or bf16, made once a call.

use rayon::prelude::*;

use super::isa::Isa;
use super::q8::{BlockQ8K, BlockQ8x2, quantize_q8, quantize_q8k};
use super::qmatrix::QMatrix;
use super::types::{GgmlType, QK, QK_K};

/// Activations in each form the weight types of a call need, quantized once.
pub(super) struct ActsSet<'x> {
    x: &'x [f32],
    q8: Vec<BlockQ8x2>,
    q8k: Vec<BlockQ8K>,
    /// `x` rounded to bf16, where bf16 weights take the pair products.
    bf16: Option<Vec<u16>>,
}

/// Activations in the form one weight type's kernels take.
#[derive(Clone, Copy)]
pub(super) enum Acts<'a> {
    F32(&'a [f32]),
    Q8(&'a [BlockQ8x2]),
    Q8K(&'a [BlockQ8K]),
    /// Activations as bf16 bits, for bf16 weights on bf16 pairs.
    Bf16(&'a [u16]),
}

/// Tokens from which activation quantization is spread over threads.
const PAR_QUANTIZE_TOKENS: usize = 8;

/// `per_row` blocks of activations per token of `x` (`cols` each).
fn quantize_tokens<B: Copy + Send>(
    x: &[f32],
    cols: usize,
    per_row: usize,
    zero: B,
    quantize: impl Fn(&[f32], &mut [B]) + Sync,
) -> Vec<B> {
    let n = x.len() / cols;
    let mut out = vec![zero; n * per_row];
    if n >= PAR_QUANTIZE_TOKENS {
        out.par_chunks_mut(per_row)
            .zip(x.par_chunks(cols))
            .for_each(|(o, x)| quantize(x, o));
    } else {
        for (o, x) in out.chunks_exact_mut(per_row).zip(x.chunks_exact(cols)) {
            quantize(x, o);
        }
    }
    out
}

impl<'x> ActsSet<'x> {
    pub(super) fn quantize(isa: Isa, ws: &[QMatrix], x: &'x [f32], n: usize, cols: usize) -> Self {
        let level = isa.level();
        let needs = |f: fn(GgmlType) -> bool| ws.iter().any(|w| f(w.ty()));
        let mut set = ActsSet {
            x,
            q8: vec![],
            q8k: vec![],
            bf16: None,
        };
        #[cfg(target_arch = "x86_64")]
        if isa.bf16_pairs() && needs(|ty| ty == GgmlType::BF16) {
            // SAFETY: an Isa with bf16 pairs exists only where the CPU has AVX-512 BF16.
            set.bf16 = Some(quantize_tokens(x, cols, cols, 0u16, |x, o| unsafe {
                crate::prefill_pairs::narrow_into(o, x)
            }));
        }
        if needs(uses_q8) {
            let pairs = (cols / QK).div_ceil(2);
            set.q8 = quantize_tokens(x, cols, pairs, BlockQ8x2::ZERO, |x, o| {
                quantize_q8(level, x, o)
            });
        }
        if needs(uses_q8k) {
            set.q8k = quantize_tokens(x, cols, cols / QK_K, BlockQ8K::ZERO, |x, o| {
                quantize_q8k(level, x, o)
            });
        }
        debug_assert_eq!(x.len(), n * cols);
        set
    }

    pub(super) fn for_type(&self, ty: GgmlType) -> Acts<'_> {
        if let Some(x) = self.bf16.as_deref().filter(|_| ty == GgmlType::BF16) {
            Acts::Bf16(x)
        } else if uses_q8(ty) {
            Acts::Q8(&self.q8)
        } else if uses_q8k(ty) {
            Acts::Q8K(&self.q8k)
        } else {
            Acts::F32(self.x)
        }
    }
}

pub(super) fn uses_q8(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0
    )
}

pub(super) fn uses_q8k(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K)
}
