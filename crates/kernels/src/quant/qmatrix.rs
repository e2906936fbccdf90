//! [`QMatrix`]: a quantized weight matrix, in the file's layout or its row groups.

use super::error::QuantError;
use super::row_groups::{GROUP_ROWS, RowGroups};
use super::types::GgmlType;

/// A row-major matrix of `rows` rows of `cols` elements of type `ty`, each row stored as
/// consecutive blocks: the layout of a GGUF tensor with dims `[cols, rows]`.
#[derive(Debug, Clone, Copy)]
pub struct QMatrix<'a> {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    data: &'a [u8],
    /// The same rows regrouped, for the products to read instead where they can.
    groups: Option<&'a RowGroups>,
}

impl<'a> QMatrix<'a> {
    /// Checks that `cols` is a whole number of blocks and `data` exactly `rows` such rows.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self, QuantError> {
        let row_bytes = ty
            .row_bytes(cols)
            .ok_or(QuantError::PartialBlock { ty, elems: cols })?;
        let expected = row_bytes.checked_mul(rows).ok_or(QuantError::DataLength {
            ty,
            expected: usize::MAX,
            found: data.len(),
        })?;
        if data.len() != expected {
            return Err(QuantError::DataLength {
                ty,
                expected,
                found: data.len(),
            });
        }
        Ok(Self {
            ty,
            rows,
            cols,
            data,
            groups: None,
        })
    }

    /// This matrix, with `groups` (made from it by [`RowGroups::new`]) for its products to read.
    pub fn with_groups(self, groups: &'a RowGroups) -> Result<Self, QuantError> {
        let whole = self.rows / GROUP_ROWS * GROUP_ROWS;
        if groups.ty() != self.ty || groups.rows() != whole || groups.cols() != self.cols {
            return Err(QuantError::GroupsMismatch {
                ty: self.ty,
                rows: self.rows,
                cols: self.cols,
            });
        }
        Ok(Self {
            groups: Some(groups),
            ..self
        })
    }

    /// A matrix held in its row groups alone (every row grouped; no bytes in the file's
    /// layout): its products need a level with group kernels, and [`QMatrix::row`] has no rows.
    pub fn from_groups(groups: &'a RowGroups) -> Self {
        Self {
            ty: groups.ty(),
            rows: groups.rows(),
            cols: groups.cols(),
            data: &[],
            groups: Some(groups),
        }
    }

    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The bytes in the file's layout (none for a matrix held in its groups alone).
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// Whether the products read row groups ([`QMatrix::with_groups`]) where they can.
    pub fn grouped(&self) -> bool {
        self.groups.is_some()
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.ty.row_bytes(self.cols).unwrap_or(0)
    }

    /// The stored bytes of row `r`. Panics if `r >= rows`, or if the matrix is held in its
    /// groups alone ([`QMatrix::from_groups`]; [`QMatrix::dequantize_row`] reads those).
    pub fn row(&self, r: usize) -> &'a [u8] {
        assert!(r < self.rows, "row {r} of a {}-row matrix", self.rows);
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    /// Row `r` dequantized into `out` (`cols` long), e.g. an embedding lookup.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> Result<(), QuantError> {
        if r >= self.rows {
            return Err(QuantError::RowOutOfRange {
                row: r,
                rows: self.rows,
            });
        }
        match self.groups.filter(|_| self.data.is_empty()) {
            Some(g) => {
                let mut bytes = vec![0u8; self.row_bytes()];
                if !g.file_row(r, &mut bytes) {
                    return Err(QuantError::GroupsOnly { ty: self.ty });
                }
                super::dequant::dequantize_row(self.ty, &bytes, out)
            }
            None => super::dequant::dequantize_row(self.ty, self.row(r), out),
        }
    }

    /// The row groups the products read, if any.
    pub(super) fn groups(&self) -> Option<&'a RowGroups> {
        self.groups
    }

    /// Whether the matrix is held in its row groups alone.
    pub(super) fn groups_only(&self) -> bool {
        self.data.is_empty() && self.groups.is_some()
    }
}
