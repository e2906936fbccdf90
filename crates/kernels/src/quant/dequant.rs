//! Dequantization to f32, exactly as ggml defines each format.

use half::{bf16, f16};

use super::error::QuantError;
use super::types::{GgmlType, QK, QK_K};

/// Decodes `out.len()` consecutive elements of type `ty` from `bytes`.
///
/// `out.len()` must be a whole number of blocks and `bytes` exactly their storage.
pub fn dequantize_row(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let expected = ty.row_bytes(out.len()).ok_or(QuantError::PartialBlock {
        ty,
        elems: out.len(),
    })?;
    if bytes.len() != expected {
        return Err(QuantError::DataLength {
            ty,
            expected,
            found: bytes.len(),
        });
    }
    let blocks = bytes
        .chunks_exact(ty.block_bytes())
        .zip(out.chunks_exact_mut(ty.block_size()));
    match ty {
        GgmlType::F32 => {
            blocks.for_each(|(b, y)| y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        }
        GgmlType::F16 => blocks.for_each(|(b, y)| y[0] = f16_at(b, 0)),
        GgmlType::BF16 => {
            blocks.for_each(|(b, y)| y[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32())
        }
        GgmlType::Q4_0 => blocks.for_each(|(b, y)| q4_0(b, y)),
        GgmlType::Q4_1 => blocks.for_each(|(b, y)| q4_1(b, y)),
        GgmlType::Q5_0 => blocks.for_each(|(b, y)| q5_0(b, y)),
        GgmlType::Q8_0 => blocks.for_each(|(b, y)| q8_0(b, y)),
        GgmlType::Q4_K => blocks.for_each(|(b, y)| q4_k(b, y)),
        GgmlType::Q6_K => blocks.for_each(|(b, y)| q6_k(b, y)),
    }
    Ok(())
}

/// The little-endian f16 at `b[i..i + 2]`, widened.
#[inline]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// `{ d: f16, qs: [u8; 16] }`: element `j` is `d * (nibble - 8)`, low nibbles first.
fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        y[j] = d * ((q & 0xF) as i32 - 8) as f32;
        y[j + QK / 2] = d * ((q >> 4) as i32 - 8) as f32;
    }
}

/// `{ d: f16, m: f16, qs: [u8; 16] }`: element `j` is `d * nibble + m`.
fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for (j, &q) in b[4..20].iter().enumerate() {
        y[j] = d * (q & 0xF) as f32 + m;
        y[j + QK / 2] = d * (q >> 4) as f32 + m;
    }
}

/// `{ d: f16, qh: u32, qs: [u8; 16] }`: element `j` is `d * (nibble | bit_j(qh) << 4) - 16)`.
fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for (j, &q) in b[6..22].iter().enumerate() {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        y[j] = d * (((q & 0xF) as u32 | h0) as i32 - 16) as f32;
        y[j + QK / 2] = d * (((q >> 4) as u32 | h1) as i32 - 16) as f32;
    }
}

/// `{ d: f16, qs: [i8; 32] }`: element `j` is `d * qs[j]`.
fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (yj, &q) in y.iter_mut().zip(&b[2..34]) {
        *yj = d * (q as i8) as f32;
    }
}

/// Scale and min of sub-block `j` (of eight) from the 12 packed 6-bit pairs of a Q4_K block.
#[inline]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// `{ d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128] }`: eight sub-blocks of 32; sub-block
/// `s` is `d * scale_s * nibble - dmin * min_s`. Each 32 bytes of `qs` hold two sub-blocks, low
/// nibbles first.
fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let qs = &b[16..144];
    for (pair, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc0, m0) = scale_min_k4(2 * pair, scales);
        let (sc1, m1) = scale_min_k4(2 * pair + 1, scales);
        let (d0, min0) = (d * sc0 as f32, dmin * m0 as f32);
        let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
        for (l, &q) in q.iter().enumerate() {
            y[l] = d0 * (q & 0xF) as f32 - min0;
            y[l + 32] = d1 * (q >> 4) as f32 - min1;
        }
    }
}

/// `{ ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16 }`: 6-bit values (`ql` nibble, two
/// bits of `qh`) minus 32, scaled per 16 elements by `d * scale`.
fn q6_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 208);
    for half in 0..QK_K / 128 {
        let ql = &b[64 * half..64 * half + 64];
        let qh = &b[128 + 32 * half..128 + 32 * half + 32];
        let sc = &b[192 + 8 * half..192 + 8 * half + 8];
        let y = &mut y[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}
