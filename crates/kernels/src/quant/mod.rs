//! Quantized weights in ggml's formats: dequantization, and matrix products that keep the weights
//! quantized (8-bit activations and integer dot products for the quantized formats).
//!
//! - `types`: the supported [`GgmlType`]s and the block layout of every ggml type id.
//! - `dequant`: [`dequantize_row`] for every supported type, exactly as ggml defines it.
//! - `q8`: 8-bit quantization of activations (blocks of 32, paired; blocks of 256 with per-16
//!   sums).
//! - `row_groups`: [`RowGroups`], quantized rows regrouped eight at a time for AVX2 and AVX-512
//!   VNNI; `dot_groups`, their products.
//! - `qmatrix`: [`QMatrix`], a matrix in the file's layout, its row groups, or both.
//! - `acts`: a product's activations in each form the weight types take, made once a call.
//! - `matmul`: [`matmul`] and [`matmul_many`], multi-threaded over rows.
//! - `dot_scalar`, `dot_avx2`, `dot_avx512`: one weight row (or a few) times a few activation
//!   rows, per instruction set ([`Isa`]); `dot_float512`, `dot_bf16_pairs`: float weights in
//!   tiles of rows and tokens with AVX-512, and bf16 ones on bf16 pairs, behind `row_tiles`' trait.

mod acts;
mod dequant;
#[cfg(target_arch = "x86_64")]
mod dot_avx2;
#[cfg(target_arch = "x86_64")]
mod dot_avx512;
#[cfg(target_arch = "x86_64")]
mod dot_bf16_pairs;
#[cfg(target_arch = "x86_64")]
mod dot_float512;
#[cfg(target_arch = "x86_64")]
mod dot_groups;
mod dot_scalar;
mod error;
mod isa;
mod matmul;
mod q8;
mod qmatrix;
mod row_groups;
#[cfg(target_arch = "x86_64")]
mod row_tiles;
mod types;

pub use dequant::dequantize_row;
pub use error::QuantError;
pub use isa::{Isa, IsaLevel};
pub use matmul::{matmul, matmul_many, matmul_many_with, matmul_with};
pub use qmatrix::QMatrix;
pub use row_groups::{GROUP_ROWS, RowGroups};
pub use types::{GgmlType, QK, QK_K, TypeLayout, UnsupportedType, type_layout};
