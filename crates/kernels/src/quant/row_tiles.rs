//! Kernels that take a tile of weight rows times a few tokens with AVX-512: float weights
//! widened to f32 (`dot_float512`) and bf16 ones on bf16 pairs (`dot_bf16_pairs`), behind one
//! trait whose token-block driver both share.

use super::dot_avx2::FloatKind;
use super::dot_bf16_pairs as pairs;
use super::dot_float512 as float512;
use super::types::GgmlType;

/// Rows and tokens a row-tile kernel takes at once: 24 accumulators of 512 bits (against two
/// rows of four tokens and four of two or three, as fast or faster).
pub(super) const TILE_ROWS: usize = 3;
pub(super) const TILE_TOKENS: usize = 4;

/// A kernel of `R` weight rows times up to [`TILE_TOKENS`] activation rows at once, each sum as
/// the kernel gives it for one row and one token alone.
pub(super) trait RowTiles: Copy {
    type Act;

    /// `R` rows times `TB` tokens (`TB <= TILE_TOKENS`).
    fn tile<const R: usize, const TB: usize>(
        self,
        w: [&[u8]; R],
        xs: [&[Self::Act]; TB],
    ) -> [[f32; TB]; R];

    /// `R` rows times `NT` tokens, [`TILE_TOKENS`] at a time.
    fn rows<const R: usize, const NT: usize>(
        self,
        w: [&[u8]; R],
        xs: [&[Self::Act]; NT],
    ) -> [[f32; NT]; R] {
        fn pad<const R: usize, const TB: usize>(s: [[f32; TB]; R]) -> [[f32; TILE_TOKENS]; R] {
            s.map(|s| std::array::from_fn(|i| if i < TB { s[i] } else { 0.0 }))
        }
        let mut out = [[0.0; NT]; R];
        for t in (0..NT).step_by(TILE_TOKENS) {
            let sums = match NT - t {
                1 => pad(self.tile::<R, 1>(w, [xs[t]])),
                2 => pad(self.tile::<R, 2>(w, [xs[t], xs[t + 1]])),
                3 => pad(self.tile::<R, 3>(w, [xs[t], xs[t + 1], xs[t + 2]])),
                _ => self.tile::<R, 4>(w, [xs[t], xs[t + 1], xs[t + 2], xs[t + 3]]),
            };
            for (o, s) in out.iter_mut().zip(sums) {
                for (o, s) in o[t..].iter_mut().zip(s) {
                    *o = s;
                }
            }
        }
        out
    }
}

/// bf16 weights on bf16 pairs, with activations in bf16 ([`Acts::Bf16`], made only for an Isa
/// with bf16 pairs).
#[derive(Clone, Copy)]
pub(super) struct PairTiles;

impl RowTiles for PairTiles {
    type Act = u16;
    fn tile<const R: usize, const TB: usize>(
        self,
        w: [&[u8]; R],
        xs: [&[u16]; TB],
    ) -> [[f32; TB]; R] {
        // SAFETY: bf16 activations exist only for an Isa with bf16 pairs, which detection or
        // `Isa::with_bf16_pairs` gives only where the CPU has AVX-512 BF16.
        unsafe { pairs::tile(w, xs) }
    }
}

/// Float weights of a kind with AVX-512 (taken only at the `Avx512Vnni` level).
#[derive(Clone, Copy)]
pub(super) struct FloatTiles(pub(super) FloatKind);

impl RowTiles for FloatTiles {
    type Act = f32;
    fn tile<const R: usize, const TB: usize>(
        self,
        w: [&[u8]; R],
        xs: [&[f32]; TB],
    ) -> [[f32; TB]; R] {
        // SAFETY: the Avx512Vnni level exists only where detection found AVX-512 F, BW and VL.
        unsafe { float512::tile(self.0, w, xs) }
    }
}

pub(super) fn float_kind(ty: GgmlType) -> FloatKind {
    match ty {
        GgmlType::F16 => FloatKind::F16,
        GgmlType::BF16 => FloatKind::Bf16,
        _ => FloatKind::F32,
    }
}
