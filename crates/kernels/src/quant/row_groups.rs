//! Quantized rows regrouped eight at a time, for the 8-bit dot products of AVX2 and AVX-512
//! VNNI.
//!
//! In a file's layout each row's super-blocks follow one another, so a product reads one row
//! at a time and must apply each sub-block's scale to that row's products alone: a multiply for
//! every 32 (Q4_K) or 16 (Q6_K) multiply-adds. Grouped, one 32-byte vector holds 4 consecutive
//! weights of each of 8 rows; one `vpdpbusd` (AVX2: `vpmaddubsw`, its sums widened later) with 4
//! activations broadcast sums them into a lane per row, and a sub-block's scales take one
//! multiply for all 8 rows (`dot_groups`).
//!
//! A group's super-block (256 columns of 8 rows) holds, for Q4_K ([`Q4K_GROUP_BYTES`]):
//! - the 6-bit scales, 64 bytes, `[sub-block][row]`;
//! - the 6-bit mins, 64 bytes, `[pair j][row][2]`;
//! - `d` and `dmin`, eight f16 each;
//! - `qs`, 1024 bytes: for each pair `j` of sub-blocks and chunk `c` of 4 columns, 32 bytes
//!   holding row `r`'s bytes `32 j + 4 c .. + 4` of its `qs` at `4 r` (low nibbles sub-block
//!   `2 j`, high nibbles `2 j + 1`, as in the file);
//!
//! and for Q6_K ([`Q6K_GROUP_BYTES`], the size of 8 rows in the file):
//! - the signed scales, 128 bytes, `[sub-block pair][row][2]`;
//! - for each sub-block of 16 columns, 96 bytes: the low 4 bits of its four chunks of 4 columns
//!   (32 bytes of chunks 0 and 1 as low and high nibbles, 32 of chunks 2 and 3), then their top
//!   2 bits (32 bytes, chunk `c` at bits `2 c`), each chunk's byte `4 r + i` row `r`'s column
//!   `4 c + i`;
//! - `d`, eight f16.
//!
//! The K-quants' scales come first so that a product reads each super-block front to back.
//! For the 32-column formats, a group's block of 32 columns holds 32 bytes for each chunk of 4
//! columns, each holding its values as unsigned bytes (row `r`'s column `4 c + i` at `4 r + i`):
//! Q8_0's plus 128; Q4_0, Q4_1 and Q5_0's nibbles, chunks `c` and `c + 4` in the low and high
//! nibbles of one vector, and Q5_0's fifth bits in one more (chunk `c` at bit `c`); then `d`
//! (and Q4_1's `m`), eight f16. A group of each is the size of its 8 rows in the file.
//!
//! Rows past the last whole group stay in the file's layout, as does the whole matrix where
//! this CPU has no AVX2: the grouped copy only speeds products up, the file's bytes
//! stay the weights.

use rayon::prelude::*;

use super::dequant::scale_min_k4;
use super::isa::{Isa, IsaLevel};
use super::qmatrix::QMatrix;
use super::types::{GgmlType, QK_K};

/// Rows in a group.
pub const GROUP_ROWS: usize = 8;
/// Bytes of a Q4_K group's super-block.
pub const Q4K_GROUP_BYTES: usize = 1184;
/// Bytes of a Q6_K group's super-block (as in the file).
pub const Q6K_GROUP_BYTES: usize = 1680;
pub(super) const Q4K_SCALES_AT: usize = 0;
pub(super) const Q4K_MINS_AT: usize = 64;
pub(super) const Q4K_D_AT: usize = 128;
pub(super) const Q4K_DMIN_AT: usize = 144;
pub(super) const Q4K_VALUES_AT: usize = 160;
pub(super) const Q6K_SCALES_AT: usize = 0;
pub(super) const Q6K_VALUES_AT: usize = 128;
pub(super) const Q6K_D_AT: usize = 1664;
/// Where a 32-column format's group block keeps its `d`s (after the values) and Q5_0 its fifth
/// bits.
pub(super) const fn block32_d_at(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q8_0 => 256,
        GgmlType::Q5_0 => 160,
        _ => 128,
    }
}
pub(super) const Q5_0_HIGH_AT: usize = 128;

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u8; 64]);

/// The whole groups of a quantized matrix's rows, regrouped (see the module's documentation).
pub struct RowGroups {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    lines: Vec<Line>,
}

impl std::fmt::Debug for RowGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowGroups")
            .field("ty", &self.ty)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish_non_exhaustive()
    }
}

/// Bytes of a group's block (a super-block for the K-quants) of type `ty`, for the regrouped
/// types: those of its 8 rows in the file, but for Q4_K's unpacked scales.
fn group_block_bytes(ty: GgmlType) -> Option<usize> {
    match ty {
        GgmlType::Q4_K => Some(Q4K_GROUP_BYTES),
        GgmlType::Q6_K | GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0 => {
            Some(GROUP_ROWS * ty.block_bytes())
        }
        _ => None,
    }
}

impl RowGroups {
    /// `w`'s whole groups of rows regrouped, where this CPU's best kernels use them: a Q4_0,
    /// Q4_1, Q5_0, Q8_0, Q4_K or Q6_K matrix of at least [`GROUP_ROWS`] rows, with AVX2 (and
    /// FMA, F16C). `None` otherwise.
    pub fn new(w: &QMatrix) -> Option<Self> {
        let usable = Isa::detect().level() != IsaLevel::Scalar;
        let block = group_block_bytes(w.ty())?;
        (usable && w.rows() >= GROUP_ROWS).then(|| Self::regroup(w, block))
    }

    fn regroup(w: &QMatrix, block: usize) -> Self {
        let groups = w.rows() / GROUP_ROWS;
        let file_block = w.ty().block_bytes();
        let group_bytes = w.cols() / w.ty().block_size() * block;
        let mut lines = vec![Line([0; 64]); (groups * group_bytes).div_ceil(64)];
        // SAFETY: `Line` is 64 plain bytes; the view covers exactly the vector's storage.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<u8>(), lines.len() * 64)
        };
        bytes[..groups * group_bytes]
            .par_chunks_mut(group_bytes)
            .enumerate()
            .for_each(|(g, out)| {
                let rows: [&[u8]; GROUP_ROWS] = std::array::from_fn(|r| w.row(GROUP_ROWS * g + r));
                for (b, o) in out.chunks_exact_mut(block).enumerate() {
                    let src = rows.map(|row| &row[b * file_block..(b + 1) * file_block]);
                    match w.ty() {
                        GgmlType::Q4_K => regroup_q4_k(&src, o),
                        GgmlType::Q6_K => regroup_q6_k(&src, o),
                        ty => regroup_block32(ty, &src, o),
                    }
                }
            });
        Self {
            ty: w.ty(),
            rows: groups * GROUP_ROWS,
            cols: w.cols(),
            lines,
        }
    }

    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// Rows held grouped: the matrix's first `rows()`.
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Group `g`'s bytes (its super-blocks in order).
    pub(super) fn group(&self, g: usize) -> &[u8] {
        let block = group_block_bytes(self.ty).expect("a regrouped type");
        let gb = self.cols / self.ty.block_size() * block;
        // SAFETY: as in `regroup`.
        let bytes = unsafe {
            std::slice::from_raw_parts(self.lines.as_ptr().cast::<u8>(), self.lines.len() * 64)
        };
        &bytes[g * gb..(g + 1) * gb]
    }

    /// Heap bytes held.
    pub fn size_bytes(&self) -> usize {
        self.lines.len() * 64
    }

    /// Row `r`'s bytes as the file lays them out, into `out` (a row's bytes), for the types
    /// whose groups keep every bit of their rows in whole bytes (Q8_0); `false` for the others,
    /// or a row past the groups.
    pub fn file_row(&self, r: usize, out: &mut [u8]) -> bool {
        let row_bytes = self.ty.row_bytes(self.cols);
        if self.ty != GgmlType::Q8_0 || r >= self.rows || row_bytes != Some(out.len()) {
            return false;
        }
        let (group, i) = (self.group(r / GROUP_ROWS), r % GROUP_ROWS);
        let (file_block, d_at) = (self.ty.block_bytes(), block32_d_at(self.ty));
        let blocks = group.chunks_exact(GROUP_ROWS * file_block);
        for (src, dst) in blocks.zip(out.chunks_exact_mut(file_block)) {
            dst[..2].copy_from_slice(&src[d_at + 2 * i..d_at + 2 * i + 2]);
            for (k, q) in dst[2..].iter_mut().enumerate() {
                let (c, j) = (k / 4, k % 4);
                *q = src[32 * c + 4 * i + j] ^ 0x80;
            }
        }
        true
    }
}

/// One Q4_K super-block of 8 rows (`src`, each in the file's layout) into `out`.
fn regroup_q4_k(src: &[&[u8]; GROUP_ROWS], out: &mut [u8]) {
    for (r, b) in src.iter().enumerate() {
        let qs = &b[16..144];
        for j in 0..4 {
            for c in 0..8 {
                let at = Q4K_VALUES_AT + 256 * j + 32 * c + 4 * r;
                out[at..at + 4].copy_from_slice(&qs[32 * j + 4 * c..32 * j + 4 * c + 4]);
            }
        }
        for s in 0..8 {
            let (sc, m) = scale_min_k4(s, &b[4..16]);
            out[Q4K_SCALES_AT + GROUP_ROWS * s + r] = sc;
            out[Q4K_MINS_AT + 16 * (s / 2) + 2 * r + s % 2] = m;
        }
        out[Q4K_D_AT + 2 * r..Q4K_D_AT + 2 * r + 2].copy_from_slice(&b[0..2]);
        out[Q4K_DMIN_AT + 2 * r..Q4K_DMIN_AT + 2 * r + 2].copy_from_slice(&b[2..4]);
    }
}

/// A Q6_K super-block's 256 unsigned 6-bit values (`ql` nibble, two bits of `qh`), in order.
fn q6_k_values(b: &[u8]) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for half in 0..2 {
        let (ql, qh) = (
            &b[64 * half..64 * half + 64],
            &b[128 + 32 * half..160 + 32 * half],
        );
        let q = &mut q[128 * half..128 * half + 128];
        for l in 0..32 {
            q[l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
            q[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
            q[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            q[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    q
}

/// One Q6_K super-block of 8 rows (`src`, each in the file's layout) into `out`.
fn regroup_q6_k(src: &[&[u8]; GROUP_ROWS], out: &mut [u8]) {
    for (r, b) in src.iter().enumerate() {
        let q = q6_k_values(b);
        for s in 0..16 {
            let sub = &mut out[Q6K_VALUES_AT + 96 * s..Q6K_VALUES_AT + 96 * s + 96];
            for i in 0..4 {
                let at = 4 * r + i;
                let v = |c: usize| q[16 * s + 4 * c + i];
                sub[at] = (v(0) & 0xF) | (v(1) & 0xF) << 4;
                sub[32 + at] = (v(2) & 0xF) | (v(3) & 0xF) << 4;
                sub[64 + at] = (v(0) >> 4) | (v(1) >> 4) << 2 | (v(2) >> 4) << 4 | (v(3) >> 4) << 6;
            }
            out[Q6K_SCALES_AT + 16 * (s / 2) + 2 * r + s % 2] = b[192 + s];
        }
        out[Q6K_D_AT + 2 * r..Q6K_D_AT + 2 * r + 2].copy_from_slice(&b[208..210]);
    }
}

/// A 32-column block's values as unsigned bytes (Q8_0's plus 128, Q5_0's with their fifth bit).
fn block32_values(ty: GgmlType, b: &[u8]) -> [u8; 32] {
    let mut v = [0u8; 32];
    if ty == GgmlType::Q8_0 {
        for (v, &q) in v.iter_mut().zip(&b[2..34]) {
            *v = q ^ 0x80;
        }
        return v;
    }
    let qs_at = match ty {
        GgmlType::Q4_0 => 2,
        GgmlType::Q4_1 => 4,
        _ => 6,
    };
    for (j, &q) in b[qs_at..qs_at + 16].iter().enumerate() {
        v[j] = q & 0xF;
        v[j + 16] = q >> 4;
    }
    if ty == GgmlType::Q5_0 {
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        for (k, v) in v.iter_mut().enumerate() {
            *v |= ((qh >> k) as u8 & 1) << 4;
        }
    }
    v
}

/// One block of 32 columns of 8 rows of a 32-column format (`src`, each in the file's layout)
/// into `out`.
fn regroup_block32(ty: GgmlType, src: &[&[u8]; GROUP_ROWS], out: &mut [u8]) {
    let d_at = block32_d_at(ty);
    for (r, b) in src.iter().enumerate() {
        let v = block32_values(ty, b);
        for c in 0..8 {
            for i in 0..4 {
                let (k, at) = (4 * c + i, 4 * r + i);
                match ty {
                    GgmlType::Q8_0 => out[32 * c + at] = v[k],
                    _ if c < 4 => out[32 * c + at] |= v[k] & 0xF,
                    _ => out[32 * (c - 4) + at] |= (v[k] & 0xF) << 4,
                }
                if ty == GgmlType::Q5_0 {
                    out[Q5_0_HIGH_AT + at] |= (v[k] >> 4) << c;
                }
            }
        }
        out[d_at + 2 * r..d_at + 2 * r + 2].copy_from_slice(&b[0..2]);
        if ty == GgmlType::Q4_1 {
            out[d_at + 16 + 2 * r..d_at + 18 + 2 * r].copy_from_slice(&b[2..4]);
        }
    }
}
