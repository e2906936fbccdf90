//! fp8 e4m3 storage: bias 7, no infinities, 0x7f and 0xff the NaNs, finite values past 448
//! saturated to 448 (as vLLM's unscaled fp8 cache), rounded to nearest even. The GPU pool's
//! kernels round bit for bit the same way (`crates/cuda/src/kernels/kv_elem.cu`).

use crate::{KvDtype, KvElem};

/// One fp8 e4m3 value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct F8E4M3(pub u8);

/// The value of every byte, so that widening is one load.
static VALUES: [f32; 256] = {
    let mut t = [0.0f32; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = to_f32(b as u8);
        b += 1;
    }
    t
};

// SAFETY: one byte, the e4m3 bits as stored.
unsafe impl KvElem for F8E4M3 {
    const DTYPE: KvDtype = KvDtype::Fp8;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        VALUES[self.0 as usize]
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        F8E4M3(from_f32(x))
    }
    fn as_fp8(x: &[Self]) -> Option<&[F8E4M3]> {
        Some(x)
    }
}

/// `x` rounded to the nearest e4m3 value, ties to even.
pub fn from_f32(x: f32) -> u8 {
    let u = x.to_bits();
    let s = ((u >> 24) & 0x80) as u8;
    let a = u & 0x7fff_ffff;
    if a > 0x7f80_0000 {
        return s | 0x7f;
    }
    if a > 0x43e0_0000 {
        return s | 0x7e;
    }
    if a < 0x3c80_0000 {
        // Below 2^-6 the steps are 2^-9; the product is exact, so this rounds once.
        return s | (f32::from_bits(a) * 512.0).round_ties_even() as u8;
    }
    let r = (a + 0x7_ffff + ((a >> 20) & 1)) >> 20;
    s | ((((r >> 3) - 120) << 3) | (r & 7)) as u8
}

/// A row quantized as a weight matrix's row is on the GPU (`--weight-dtype fp8`): its scale,
/// the largest magnitude / 448, and each value / scale as e4m3. The device rounds bit for bit the
/// same way.
pub fn quantize_row(row: &[f32]) -> (f32, Vec<u8>) {
    let max = row.iter().fold(0f32, |m, v| m.max(v.abs()));
    let inv = if max > 0.0 { 448.0 / max } else { 0.0 };
    let bytes = row.iter().map(|&v| from_f32(v * inv)).collect();
    (max / 448.0, bytes)
}

/// The value of an e4m3 byte.
pub const fn to_f32(b: u8) -> f32 {
    let (e, m) = (((b >> 3) & 15) as u32, (b & 7) as u32);
    let mag = if b & 0x7f == 0x7f {
        f32::NAN
    } else if e == 0 {
        m as f32 / 512.0
    } else {
        f32::from_bits(((e + 120) << 23) | (m << 20))
    };
    if b & 0x80 != 0 { -mag } else { mag }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quantized_row_is_scaled_to_448() {
        let (scale, bytes) = quantize_row(&[0.5, -2.0, 0.0, 1.0]);
        assert_eq!(scale, 2.0 / 448.0);
        let back: Vec<f32> = bytes.iter().map(|&b| to_f32(b) * scale).collect();
        assert_eq!(back[1], -2.0);
        assert_eq!(back[2], 0.0);
        for (b, v) in back.iter().zip([0.5f32, -2.0, 0.0, 1.0]) {
            assert!((b - v).abs() <= v.abs() / 16.0, "{b} against {v}");
        }
        assert_eq!(quantize_row(&[0.0; 3]), (0.0, vec![0; 3]));
    }

    #[test]
    fn every_value_round_trips() {
        for b in 0..=255u8 {
            if b & 0x7f == 0x7f {
                assert!(to_f32(b).is_nan());
                continue;
            }
            let x = to_f32(b);
            // -0 and +0 keep their sign bits.
            assert_eq!(from_f32(x), b, "{b:#04x} = {x}");
        }
    }

    #[test]
    fn known_values() {
        assert_eq!(to_f32(0x7e), 448.0);
        assert_eq!(to_f32(0x01), 2f32.powi(-9));
        assert_eq!(to_f32(0x08), 2f32.powi(-6));
        assert_eq!(to_f32(0x38), 1.0);
        assert_eq!(to_f32(0xb8), -1.0);
        assert_eq!(from_f32(1e6), 0x7e);
        assert_eq!(from_f32(f32::NEG_INFINITY), 0xfe);
        assert_eq!(from_f32(f32::NAN) & 0x7f, 0x7f);
        assert_eq!(from_f32(1e-9), 0);
    }

    #[test]
    fn rounds_to_nearest_even() {
        let values: Vec<f32> = (0..=0x7e).map(to_f32).collect();
        for w in values.windows(2) {
            let (lo, hi) = (w[0], w[1]);
            let mid = (lo + hi) / 2.0;
            let even = if from_f32(lo) & 1 == 0 { lo } else { hi };
            assert_eq!(to_f32(from_f32(mid)), even, "tie between {lo} and {hi}");
            let below = f32::from_bits(mid.to_bits() - 1);
            let above = f32::from_bits(mid.to_bits() + 1);
            assert_eq!(to_f32(from_f32(below)), lo);
            assert_eq!(to_f32(from_f32(above)), hi);
            assert_eq!(to_f32(from_f32(-above)), -hi);
        }
        // Between 448 and the next step (480, not a value): saturates.
        assert_eq!(to_f32(from_f32(470.0)), 448.0);
    }
}
