//! What can go wrong reading a GGUF file or looking something up in it.

use std::fmt;
use std::path::PathBuf;

use vortex_kernels::quant::QuantError;

use super::MAX_ARRAY_DEPTH;

/// Why a GGUF file could not be read or a lookup failed.
#[derive(Debug)]
pub enum GgufError {
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    BadMagic([u8; 4]),
    UnsupportedVersion(u32),
    /// `needed` bytes for `what` at `offset`, past the end of the file (`len` bytes).
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        len: u64,
    },
    /// A count or length that cannot fit in the rest of the file.
    TooLarge {
        what: String,
        count: u64,
        offset: u64,
    },
    InvalidValueType {
        id: u32,
        offset: u64,
    },
    InvalidUtf8 {
        offset: u64,
    },
    NestingTooDeep {
        offset: u64,
    },
    DuplicateKey(String),
    BadAlignment(String),
    DuplicateTensor(String),
    /// A tensor whose type id is no ggml type.
    UnknownType {
        tensor: String,
        id: u32,
    },
    /// A tensor of a ggml type the kernels cannot compute with.
    UnsupportedType {
        tensor: String,
        id: u32,
        name: &'static str,
    },
    BadShape {
        tensor: String,
        reason: String,
    },
    Misaligned {
        tensor: String,
        offset: u64,
        alignment: u64,
    },
    /// Tensor data (absolute byte range) past the end of the file.
    DataOutOfBounds {
        tensor: String,
        start: u64,
        end: u64,
        len: u64,
    },
    MissingKey(String),
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    MissingTensor(String),
    Quant {
        tensor: String,
        source: QuantError,
    },
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use GgufError::*;
        match self {
            Io { path, source } => write!(f, "{}: {source}", path.display()),
            BadMagic(m) => write!(f, "not a GGUF file: magic {m:02x?}, expected \"GGUF\""),
            UnsupportedVersion(v) => write!(f, "unsupported GGUF version {v} (supported: 2, 3)"),
            Truncated {
                what,
                offset,
                needed,
                len,
            } => write!(
                f,
                "truncated file: {what} at offset {offset} needs {needed} bytes, \
                 the file ends at {len}"
            ),
            TooLarge {
                what,
                count,
                offset,
            } => write!(
                f,
                "{what} at offset {offset}: {count} does not fit in the rest of the file"
            ),
            InvalidValueType { id, offset } => {
                write!(f, "invalid metadata value type {id} at offset {offset}")
            }
            InvalidUtf8 { offset } => write!(f, "string at offset {offset} is not valid UTF-8"),
            NestingTooDeep { offset } => write!(
                f,
                "arrays nested deeper than {MAX_ARRAY_DEPTH} levels at offset {offset}"
            ),
            DuplicateKey(k) => write!(f, "duplicate metadata key {k:?}"),
            BadAlignment(why) => write!(f, "invalid general.alignment: {why}"),
            DuplicateTensor(t) => write!(f, "duplicate tensor name {t:?}"),
            UnknownType { tensor, id } => {
                write!(f, "tensor {tensor:?} has unknown ggml type id {id}")
            }
            UnsupportedType { tensor, id, name } => write!(
                f,
                "tensor {tensor:?} has ggml type {name} (id {id}), which is not supported \
                 (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K)"
            ),
            BadShape { tensor, reason } => write!(f, "tensor {tensor:?}: {reason}"),
            Misaligned {
                tensor,
                offset,
                alignment,
            } => write!(
                f,
                "tensor {tensor:?}: data offset {offset} is not a multiple of the alignment \
                 {alignment}"
            ),
            DataOutOfBounds {
                tensor,
                start,
                end,
                len,
            } => write!(
                f,
                "tensor {tensor:?}: data bytes {start}..{end} lie past the end of the file \
                 ({len} bytes)"
            ),
            MissingKey(k) => write!(f, "missing metadata key {k:?}"),
            WrongType {
                key,
                expected,
                found,
            } => write!(
                f,
                "metadata key {key:?}: expected {expected}, found {found}"
            ),
            MissingTensor(t) => write!(f, "missing tensor {t:?}"),
            Quant { tensor, source } => write!(f, "tensor {tensor:?}: {source}"),
        }
    }
}

impl std::error::Error for GgufError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            GgufError::Io { source, .. } => Some(source),
            GgufError::Quant { source, .. } => Some(source),
            _ => None,
        }
    }
}
