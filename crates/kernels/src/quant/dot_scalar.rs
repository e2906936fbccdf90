//! Portable dot products of one weight row with `NT` activation rows: the reference for the SIMD
//! kernels and the path for CPUs without them.
//!
//! Every function takes one row of weights (whole blocks) and `NT` activation rows of the same
//! length and returns the `NT` dot products; mismatched lengths panic.

use super::dequant::{f16_at, scale_min_k4};
use super::q8::{BlockQ8K, BlockQ8x2};
use super::types::{QK, QK_K};

/// Blocks in `w`, checking that it holds whole blocks and that every activation row matches.
pub(super) fn blocks<Y>(w: &[u8], block_bytes: usize, ys: &[&[Y]]) -> usize {
    let nb = w.len() / block_bytes;
    assert!(
        w.len() == nb * block_bytes && ys.iter().all(|y| y.len() == nb),
        "quantized dot: weight row and activations differ in length"
    );
    nb
}

/// Blocks in `w`, checking that it holds whole blocks and that every activation row has one
/// [`BlockQ8x2`] per two of them.
pub(super) fn pairs(w: &[u8], block_bytes: usize, ys: &[&[BlockQ8x2]]) -> usize {
    let nb = w.len() / block_bytes;
    assert!(
        w.len() == nb * block_bytes && ys.iter().all(|y| y.len() == nb.div_ceil(2)),
        "quantized dot: weight row and activations differ in length"
    );
    nb
}

/// Dot products of a row of 32-blocks, given per block its scale and its 32 signed values.
fn dot_block32<const NT: usize>(
    w: &[u8],
    block_bytes: usize,
    ys: [&[BlockQ8x2]; NT],
    decode: impl Fn(&[u8], &mut [i32; QK]) -> f32,
) -> [f32; NT] {
    pairs(w, block_bytes, &ys);
    let mut acc = [0.0f32; NT];
    let mut q = [0i32; QK];
    for (b, blk) in w.chunks_exact(block_bytes).enumerate() {
        let d = decode(blk, &mut q);
        for (a, y) in acc.iter_mut().zip(&ys) {
            let (qy, dy, _) = y[b / 2].block(b % 2);
            let sum: i32 = q.iter().zip(&qy).map(|(&q, &y)| q * y as i32).sum();
            *a += d * dy * sum as f32;
        }
    }
    acc
}

pub fn dot_q4_0<const NT: usize>(w: &[u8], ys: [&[BlockQ8x2]; NT]) -> [f32; NT] {
    dot_block32(w, 18, ys, |b, q| {
        for (j, &v) in b[2..18].iter().enumerate() {
            q[j] = (v & 0xF) as i32 - 8;
            q[j + 16] = (v >> 4) as i32 - 8;
        }
        f16_at(b, 0)
    })
}

pub fn dot_q5_0<const NT: usize>(w: &[u8], ys: [&[BlockQ8x2]; NT]) -> [f32; NT] {
    dot_block32(w, 22, ys, |b, q| {
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        for (j, &v) in b[6..22].iter().enumerate() {
            let h0 = (((qh >> j) & 1) << 4) as i32;
            let h1 = (((qh >> (j + 16)) & 1) << 4) as i32;
            q[j] = ((v & 0xF) as i32 | h0) - 16;
            q[j + 16] = ((v >> 4) as i32 | h1) - 16;
        }
        f16_at(b, 0)
    })
}

pub fn dot_q8_0<const NT: usize>(w: &[u8], ys: [&[BlockQ8x2]; NT]) -> [f32; NT] {
    dot_block32(w, 34, ys, |b, q| {
        for (q, &v) in q.iter_mut().zip(&b[2..34]) {
            *q = v as i8 as i32;
        }
        f16_at(b, 0)
    })
}

/// `Σ (d q + m) y = d Σ q y + m Σ y`, the second sum being the activation block's `s`.
pub fn dot_q4_1<const NT: usize>(w: &[u8], ys: [&[BlockQ8x2]; NT]) -> [f32; NT] {
    pairs(w, 20, &ys);
    let mut acc = [0.0f32; NT];
    for (b, blk) in w.chunks_exact(20).enumerate() {
        let (d, m) = (f16_at(blk, 0), f16_at(blk, 2));
        for (a, y) in acc.iter_mut().zip(&ys) {
            let (qy, dy, _) = y[b / 2].block(b % 2);
            let mut sum = 0i32;
            for (j, &v) in blk[4..20].iter().enumerate() {
                sum += (v & 0xF) as i32 * qy[j] as i32 + (v >> 4) as i32 * qy[j + 16] as i32;
            }
            *a += d * dy * sum as f32 + m * y[b / 2].s[b % 2];
        }
    }
    acc
}

/// Super-block `d * Σ_s scale_s Σ q y - dmin * Σ_s min_s Σ y`, the last sums from `bsums`.
pub fn dot_q4_k<const NT: usize>(w: &[u8], ys: [&[BlockQ8K]; NT]) -> [f32; NT] {
    blocks(w, 144, &ys);
    let mut acc = [0.0f32; NT];
    for (b, blk) in w.chunks_exact(144).enumerate() {
        let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
        let scales = &blk[4..16];
        let qs = &blk[16..144];
        for (a, y) in acc.iter_mut().zip(&ys) {
            let y = &y[b];
            let (mut sumi, mut summ) = (0i32, 0i32);
            for s in 0..8 {
                let (sc, m) = scale_min_k4(s, scales);
                let q = &qs[32 * (s / 2)..32 * (s / 2) + 32];
                let shift = 4 * (s % 2);
                let dot: i32 = (0..32)
                    .map(|l| ((q[l] >> shift) & 0xF) as i32 * y.qs[32 * s + l] as i32)
                    .sum();
                sumi += sc as i32 * dot;
                summ += m as i32 * (y.bsums[2 * s] as i32 + y.bsums[2 * s + 1] as i32);
            }
            *a += d * y.d * sumi as f32 - dmin * y.d * summ as f32;
        }
    }
    acc
}

/// Super-block `d * Σ_s scale_s Σ (q - 32) y` over sixteen sub-blocks of 16.
pub fn dot_q6_k<const NT: usize>(w: &[u8], ys: [&[BlockQ8K]; NT]) -> [f32; NT] {
    blocks(w, 210, &ys);
    let mut acc = [0.0f32; NT];
    let mut q = [0i32; QK_K];
    for (b, blk) in w.chunks_exact(210).enumerate() {
        let d = f16_at(blk, 208);
        for half in 0..2 {
            let ql = &blk[64 * half..64 * half + 64];
            let qh = &blk[128 + 32 * half..128 + 32 * half + 32];
            let q = &mut q[128 * half..128 * half + 128];
            for l in 0..32 {
                q[l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                q[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                q[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                q[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            }
        }
        let scales = &blk[192..208];
        for (a, y) in acc.iter_mut().zip(&ys) {
            let y = &y[b];
            let sumi: i32 = (0..16)
                .map(|s| {
                    let dot: i32 = (16 * s..16 * s + 16).map(|i| q[i] * y.qs[i] as i32).sum();
                    scales[s] as i8 as i32 * dot
                })
                .sum();
            *a += d * y.d * sumi as f32;
        }
    }
    acc
}

/// Element `i` of a row of f32, f16 or bf16 (`elem_bytes` 4 or 2; `bf16` picks the 2-byte kind).
fn float_at(w: &[u8], i: usize, elem_bytes: usize, bf16: bool) -> f32 {
    match (elem_bytes, bf16) {
        (4, _) => f32::from_le_bytes([w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]]),
        (_, false) => f16_at(w, 2 * i),
        (_, true) => f32::from_bits((u16::from_le_bytes([w[2 * i], w[2 * i + 1]]) as u32) << 16),
    }
}

fn dot_float<const NT: usize>(
    w: &[u8],
    xs: [&[f32]; NT],
    elem_bytes: usize,
    bf16: bool,
) -> [f32; NT] {
    let n = blocks(w, elem_bytes, &xs);
    let mut acc = [0.0f32; NT];
    for i in 0..n {
        let v = float_at(w, i, elem_bytes, bf16);
        for (a, x) in acc.iter_mut().zip(&xs) {
            *a += v * x[i];
        }
    }
    acc
}

pub fn dot_f32<const NT: usize>(w: &[u8], xs: [&[f32]; NT]) -> [f32; NT] {
    dot_float(w, xs, 4, false)
}

pub fn dot_f16<const NT: usize>(w: &[u8], xs: [&[f32]; NT]) -> [f32; NT] {
    dot_float(w, xs, 2, false)
}

pub fn dot_bf16<const NT: usize>(w: &[u8], xs: [&[f32]; NT]) -> [f32; NT] {
    dot_float(w, xs, 2, true)
}
