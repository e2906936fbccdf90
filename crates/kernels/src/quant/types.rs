//! ggml tensor types: the supported subset, and the block layout of every known type id.

use std::fmt;

/// A ggml tensor type this crate can dequantize and multiply.
///
/// Variant names follow ggml's (`Q4_0`, `Q4_K`, ...), which is how they appear in model files
/// and in every discussion of them.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q8_0,
    Q4_K,
    Q6_K,
    BF16,
}

/// Elements per K-quant super-block.
pub const QK_K: usize = 256;
/// Elements per block of the 32-element formats (Q4_0, Q4_1, Q5_0, Q8_0).
pub const QK: usize = 32;

impl GgmlType {
    pub const ALL: [GgmlType; 9] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::BF16,
    ];

    /// The supported type with ggml id `id`.
    pub fn from_id(id: u32) -> Result<Self, UnsupportedType> {
        Self::ALL
            .into_iter()
            .find(|t| t.id() == id)
            .ok_or(UnsupportedType { id })
    }

    /// The ggml type id (`enum ggml_type`), as stored in GGUF tensor infos.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q8_0 => 8,
            GgmlType::Q4_K => 12,
            GgmlType::Q6_K => 14,
            GgmlType::BF16 => 30,
        }
    }

    pub fn layout(self) -> TypeLayout {
        type_layout(self.id()).expect("every supported type has a layout")
    }

    pub fn name(self) -> &'static str {
        self.layout().name
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        self.layout().block_size
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.layout().block_bytes
    }

    /// Bytes of `elems` consecutive elements; `None` unless `elems` is a whole number of blocks
    /// (or on overflow).
    pub fn row_bytes(self, elems: usize) -> Option<usize> {
        self.layout().bytes_for(elems as u64).map(|b| b as usize)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A ggml type id that is not one of the [`GgmlType`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnsupportedType {
    pub id: u32,
}

impl fmt::Display for UnsupportedType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match type_layout(self.id) {
            Some(l) => write!(f, "ggml type {} ({}) is not supported", self.id, l.name),
            None => write!(f, "unknown ggml type id {}", self.id),
        }
    }
}

impl std::error::Error for UnsupportedType {}

/// Storage layout of a ggml type: `block_bytes` bytes hold `block_size` consecutive elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeLayout {
    pub name: &'static str,
    pub block_size: usize,
    pub block_bytes: usize,
}

impl TypeLayout {
    /// Bytes of `elems` elements; `None` unless `elems` is a whole number of blocks (or on
    /// overflow).
    pub fn bytes_for(self, elems: u64) -> Option<u64> {
        let bs = self.block_size as u64;
        if !elems.is_multiple_of(bs) {
            return None;
        }
        (elems / bs).checked_mul(self.block_bytes as u64)
    }
}

/// The layout of every type id ggml defines (supported or not); `None` for ids ggml never used
/// or has removed.
pub fn type_layout(id: u32) -> Option<TypeLayout> {
    let (name, block_size, block_bytes) = match id {
        0 => ("F32", 1, 4),
        1 => ("F16", 1, 2),
        2 => ("Q4_0", QK, 18),
        3 => ("Q4_1", QK, 20),
        6 => ("Q5_0", QK, 22),
        7 => ("Q5_1", QK, 24),
        8 => ("Q8_0", QK, 34),
        9 => ("Q8_1", QK, 36),
        10 => ("Q2_K", QK_K, 84),
        11 => ("Q3_K", QK_K, 110),
        12 => ("Q4_K", QK_K, 144),
        13 => ("Q5_K", QK_K, 176),
        14 => ("Q6_K", QK_K, 210),
        15 => ("Q8_K", QK_K, 292),
        16 => ("IQ2_XXS", QK_K, 66),
        17 => ("IQ2_XS", QK_K, 74),
        18 => ("IQ3_XXS", QK_K, 98),
        19 => ("IQ1_S", QK_K, 50),
        20 => ("IQ4_NL", QK, 18),
        21 => ("IQ3_S", QK_K, 110),
        22 => ("IQ2_S", QK_K, 82),
        23 => ("IQ4_XS", QK_K, 136),
        24 => ("I8", 1, 1),
        25 => ("I16", 1, 2),
        26 => ("I32", 1, 4),
        27 => ("I64", 1, 8),
        28 => ("F64", 1, 8),
        29 => ("IQ1_M", QK_K, 56),
        30 => ("BF16", 1, 2),
        34 => ("TQ1_0", QK_K, 54),
        35 => ("TQ2_0", QK_K, 66),
        39 => ("MXFP4", QK, 17),
        _ => return None,
    };
    Some(TypeLayout {
        name,
        block_size,
        block_bytes,
    })
}
