use std::fmt;

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
    /// A row index past the end of a matrix.
    RowOutOfRange { row: usize, rows: usize },
    /// Row groups that were not made from a matrix of this type and shape.
    GroupsMismatch {
        ty: GgmlType,
        rows: usize,
        cols: usize,
    },
    /// A matrix held in row groups alone, multiplied at a level without group kernels.
    GroupsOnly { ty: GgmlType },
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
            QuantError::RowOutOfRange { row, rows } => {
                write!(f, "row {row} of a matrix of {rows} rows")
            }
            QuantError::GroupsMismatch { ty, rows, cols } => write!(
                f,
                "row groups do not belong to this {ty} matrix of {rows} x {cols}"
            ),
            QuantError::GroupsOnly { ty } => write!(
                f,
                "this {ty} matrix is held in row groups alone, which scalar kernels cannot read"
            ),
        }
    }
}

impl std::error::Error for QuantError {}
