//! Q4_K rows regrouped eight at a time, for the integer dot products of AVX-512 VNNI.
//!
//! In a file's layout each row's super-blocks follow one another, so a product reads one row
//! at a time and must apply each sub-block's scale to that row's 32 products alone: a multiply
//! for every 32 multiply-adds. Grouped, one 32-byte load holds 4 consecutive weights of each of
//! 8 rows; one `vpdpbusd` with 4 activations broadcast sums them into a lane per row, so a
//! sub-block's 32 weights of 8 rows take 8 of them and the scales one multiply for all 8 rows.
//!
//! A group's super-block `b` (256 columns of 8 rows) is [`GROUP_BLOCK_BYTES`] bytes:
//! - `qs`, 1024 bytes: for each pair `j` of sub-blocks and chunk `c` of 4 columns, 32 bytes
//!   holding row `r`'s bytes `32 j + 4 c .. + 4` of its `qs` at `4 r` (low nibbles sub-block
//!   `2 j`, high nibbles `2 j + 1`, as in the file);
//! - the 6-bit scales, 64 bytes, `[sub-block][row]`;
//! - the 6-bit mins, 64 bytes, `[pair j][row][2]`;
//! - `d` and `dmin`, eight f16 each.
//!
//! Rows past the last whole group stay in the file's layout, as does the whole matrix where
//! this CPU has no AVX-512 VNNI: the grouped copy only speeds products up, the file's bytes
//! stay the weights.

use rayon::prelude::*;

use super::dequant::scale_min_k4;
use super::isa::{Isa, IsaLevel};
use super::matmul::QMatrix;
use super::types::{GgmlType, QK_K};

/// Rows in a group.
pub const GROUP_ROWS: usize = 8;
/// Bytes of a Q4_K super-block in the file's layout.
const BLOCK_BYTES: usize = 144;
/// Bytes of a group's super-block.
pub const GROUP_BLOCK_BYTES: usize = 1184;
const SCALES_AT: usize = 1024;
const MINS_AT: usize = 1088;
const D_AT: usize = 1152;
const DMIN_AT: usize = 1168;

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u8; 64]);

/// The whole groups of a Q4_K matrix's rows, regrouped (see the module's documentation).
pub struct RowGroups {
    rows: usize,
    cols: usize,
    lines: Vec<Line>,
}

impl std::fmt::Debug for RowGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowGroups")
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish_non_exhaustive()
    }
}

impl RowGroups {
    /// `w`'s whole groups of rows regrouped, where this CPU's best kernels use them: a Q4_K
    /// matrix of at least [`GROUP_ROWS`] rows, with AVX-512 VNNI. `None` otherwise.
    pub fn new(w: &QMatrix) -> Option<Self> {
        let usable = Isa::detect().level() == IsaLevel::Avx512Vnni;
        (usable && w.ty() == GgmlType::Q4_K && w.rows() >= GROUP_ROWS).then(|| Self::regroup(w))
    }

    fn regroup(w: &QMatrix) -> Self {
        let groups = w.rows() / GROUP_ROWS;
        let nb = w.cols() / QK_K;
        let group_bytes = nb * GROUP_BLOCK_BYTES;
        let zero = Line([0; 64]);
        let mut lines = vec![zero; (groups * group_bytes).div_ceil(64)];
        // SAFETY: `Line` is 64 plain bytes; the view covers exactly the vector's storage.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<u8>(), lines.len() * 64)
        };
        bytes[..groups * group_bytes]
            .par_chunks_mut(group_bytes)
            .enumerate()
            .for_each(|(g, out)| {
                let rows: [&[u8]; GROUP_ROWS] = std::array::from_fn(|r| w.row(GROUP_ROWS * g + r));
                for (b, o) in out.chunks_exact_mut(GROUP_BLOCK_BYTES).enumerate() {
                    let src = rows.map(|row| &row[b * BLOCK_BYTES..(b + 1) * BLOCK_BYTES]);
                    regroup_block(&src, o);
                }
            });
        Self {
            rows: groups * GROUP_ROWS,
            cols: w.cols(),
            lines,
        }
    }

    /// Rows held grouped: the matrix's first `rows()`.
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of one group (its super-blocks in order).
    pub(super) fn group_bytes(&self) -> usize {
        self.cols / QK_K * GROUP_BLOCK_BYTES
    }

    /// Group `g`'s bytes.
    pub(super) fn group(&self, g: usize) -> &[u8] {
        let gb = self.group_bytes();
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
}

/// One super-block of 8 rows (`src`, each in the file's layout) into `out`.
fn regroup_block(src: &[&[u8]; GROUP_ROWS], out: &mut [u8]) {
    for (r, b) in src.iter().enumerate() {
        let qs = &b[16..BLOCK_BYTES];
        for j in 0..4 {
            for c in 0..8 {
                let at = 256 * j + 32 * c + 4 * r;
                out[at..at + 4].copy_from_slice(&qs[32 * j + 4 * c..32 * j + 4 * c + 4]);
            }
        }
        for s in 0..8 {
            let (sc, m) = scale_min_k4(s, &b[4..16]);
            out[SCALES_AT + GROUP_ROWS * s + r] = sc;
            out[MINS_AT + 16 * (s / 2) + 2 * r + s % 2] = m;
        }
        out[D_AT + 2 * r..D_AT + 2 * r + 2].copy_from_slice(&b[0..2]);
        out[DMIN_AT + 2 * r..DMIN_AT + 2 * r + 2].copy_from_slice(&b[2..4]);
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    use core::arch::x86_64::*;

    use super::{D_AT, DMIN_AT, GROUP_BLOCK_BYTES, MINS_AT, SCALES_AT};
    use crate::quant::q8::BlockQ8K;

    /// The 32-bit word of `p` broadcast over a vector.
    ///
    /// # Safety
    /// `p` must be valid for reading 4 bytes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn broadcast_word(p: *const i8) -> __m256i {
        // SAFETY: the caller guarantees 4 readable bytes.
        _mm256_set1_epi32(unsafe { p.cast::<i32>().read_unaligned() })
    }

    /// The products of a group's 8 rows (`g`, [`super::RowGroups::group`]) with `NT` tokens'
    /// activations: `out[t]` holds rows 0..8 of token `t`. A token's result does not depend on
    /// `NT` or on the other tokens.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA, F16C and AVX-512 F, BW, VL and VNNI.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn dot_group<const NT: usize>(g: &[u8], ys: [&[BlockQ8K]; NT]) -> [__m256; NT] {
        let nb = g.len() / GROUP_BLOCK_BYTES;
        assert!(
            g.len() == nb * GROUP_BLOCK_BYTES && ys.iter().all(|y| y.len() == nb),
            "grouped Q4_K dot: weights and activations differ in length"
        );
        let m4 = _mm256_set1_epi8(0x0F);
        let mut acc = [_mm256_setzero_ps(); NT];
        for b in 0..nb {
            // SAFETY (every access to `p`): block b, GROUP_BLOCK_BYTES long, lies within `g`, and
            // the offsets below are the layout's.
            let p = unsafe { g.as_ptr().add(b * GROUP_BLOCK_BYTES) };
            // SAFETY: b < nb = y.len().
            let yb: [&BlockQ8K; NT] = std::array::from_fn(|t| unsafe { ys[t].get_unchecked(b) });
            let mut isum = [_mm256_setzero_si256(); NT];
            for j in 0..4 {
                let mut lo = [_mm256_setzero_si256(); 8];
                let mut hi = [_mm256_setzero_si256(); 8];
                for c in 0..8 {
                    let v = unsafe { _mm256_loadu_si256(p.add(256 * j + 32 * c).cast()) };
                    lo[c] = _mm256_and_si256(v, m4);
                    hi[c] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                }
                let (sc_lo, sc_hi) = unsafe {
                    (
                        _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(SCALES_AT + 16 * j).cast())),
                        _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(SCALES_AT + 16 * j + 8).cast())),
                    )
                };
                for (s, y) in isum.iter_mut().zip(&yb) {
                    let qy = y.qs.as_ptr();
                    let (mut a0, mut a1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                    for c in 0..8 {
                        // SAFETY: 64 j + 32 + 4 c + 4 <= 256 bytes of `qs`.
                        let (y0, y1) = unsafe {
                            (
                                broadcast_word(qy.add(64 * j + 4 * c)),
                                broadcast_word(qy.add(64 * j + 32 + 4 * c)),
                            )
                        };
                        a0 = _mm256_dpbusd_epi32(a0, lo[c], y0);
                        a1 = _mm256_dpbusd_epi32(a1, hi[c], y1);
                    }
                    *s = _mm256_add_epi32(
                        *s,
                        _mm256_add_epi32(
                            _mm256_mullo_epi32(a0, sc_lo),
                            _mm256_mullo_epi32(a1, sc_hi),
                        ),
                    );
                }
            }
            let (d, dmin) = unsafe {
                (
                    _mm256_cvtph_ps(_mm_loadu_si128(p.add(D_AT).cast())),
                    _mm256_cvtph_ps(_mm_loadu_si128(p.add(DMIN_AT).cast())),
                )
            };
            let mins: [__m256i; 4] = std::array::from_fn(|j| unsafe {
                _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(MINS_AT + 16 * j).cast()))
            });
            for ((a, s), y) in acc.iter_mut().zip(isum).zip(&yb) {
                let mut imin = _mm256_setzero_si256();
                for (j, m) in mins.iter().enumerate() {
                    // SAFETY: `bsums32` holds 8 i16; 2 j + 2 <= 8.
                    let bs = unsafe { broadcast_word(y.bsums32.as_ptr().add(2 * j).cast()) };
                    imin = _mm256_dpwssd_epi32(imin, *m, bs);
                }
                let dy = _mm256_set1_ps(y.d);
                *a = _mm256_fmadd_ps(_mm256_mul_ps(d, dy), _mm256_cvtepi32_ps(s), *a);
                *a = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, dy), _mm256_cvtepi32_ps(imin), *a);
            }
        }
        acc
    }
}
