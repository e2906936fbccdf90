use std::fmt;

use super::isa::IsaLevel;
use super::types::GgmlType;

/// A shape or length mismatch in a call into [`crate::quant`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuantError {
    /// A row of `elems` elements is not a whole number of `ty` blocks.
    PartialBlock { ty: GgmlType, elems: usize },
    /// `ty` data of the wrong length.
    DataLength {
        ty: GgmlType,
        expected: usize,
        found: usize,
    },
    /// A buffer of the wrong length.
    BufferLength {
        what: &'static str,
        expected: usize,
        found: usize,
    },
    /// The requested instruction set is not available on this CPU.
    UnsupportedIsa(IsaLevel),
}

impl fmt::Display for QuantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuantError::PartialBlock { ty, elems } => write!(
                f,
                "a row of {elems} elements is not a whole number of {ty} blocks of {}",
                ty.block_size()
            ),
            QuantError::DataLength {
                ty,
                expected,
                found,
            } => write!(f, "{ty} data has {found} bytes, expected {expected}"),
            QuantError::BufferLength {
                what,
                expected,
                found,
            } => write!(f, "{what} has length {found}, expected {expected}"),
            QuantError::UnsupportedIsa(level) => {
                write!(f, "instruction set {level:?} is not supported by this CPU")
            }
        }
    }
}

impl std::error::Error for QuantError {}
