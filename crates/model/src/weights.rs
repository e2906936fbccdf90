//! Weight matrices as stored: quantized GGUF blocks or 16/32-bit floats, never expanded.

use std::sync::{Arc, OnceLock};

use memmap2::Mmap;
use vortex_kernels::quant::{GgmlType, QMatrix, RowGroups, dequantize_row, matmul, matmul_many};

use crate::gguf::GgufFile;

/// Bytes of a weight: a window of a memory-mapped file, or owned (for tests and converted data).
#[derive(Debug, Clone)]
pub enum Bytes {
    Mapped {
        map: Arc<Mmap>,
        start: usize,
        end: usize,
    },
    Gguf {
        file: Arc<GgufFile>,
        start: usize,
        end: usize,
    },
    Owned(Arc<Vec<u8>>),
    /// Nothing in the file's layout: the weight's rows live in its row groups alone
    /// ([`Weight::from_groups`]).
    Grouped,
}

impl Bytes {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped { map, start, end } => &map[*start..*end],
            Bytes::Gguf { file, start, end } => &file.bytes()[*start..*end],
            Bytes::Owned(v) => v,
            Bytes::Grouped => &[],
        }
    }

    /// Lets mapped bytes leave this process's memory until read again.
    fn release(&self) {
        match self {
            Bytes::Mapped { map, start, end } => crate::gguf::release_pages(map, *start, *end),
            Bytes::Gguf { file, start, end } => file.release(*start, *end),
            Bytes::Owned(_) | Bytes::Grouped => {}
        }
    }
}

/// A `rows x cols` matrix (`rows` outputs, `cols` inputs), each row stored as consecutive blocks.
#[derive(Debug, Clone)]
pub struct Weight {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub bytes: Bytes,
    /// The rows regrouped for the CPU's products ([`RowGroups`]), made at the first product or
    /// by [`Weight::group_rows`]; shared by clones. Once they exist, the products read them
    /// instead of mapped file pages, which are released (read again only by lookups of rows).
    groups: Arc<OnceLock<Option<RowGroups>>>,
}

impl Weight {
    pub fn new(ty: GgmlType, rows: usize, cols: usize, bytes: Bytes) -> Self {
        Self {
            ty,
            rows,
            cols,
            bytes,
            groups: Arc::default(),
        }
    }

    /// A weight held in row groups alone, every row grouped: a matrix quantized when loaded
    /// keeps no second copy in the file's layout.
    pub fn from_groups(groups: RowGroups) -> Self {
        Self {
            ty: groups.ty(),
            rows: groups.rows(),
            cols: groups.cols(),
            bytes: Bytes::Grouped,
            groups: Arc::new(OnceLock::from(Some(groups))),
        }
    }

    /// The matrix as the CPU's products read it: the stored bytes, and their row groups where
    /// this CPU's kernels use them.
    pub fn matrix(&self) -> QMatrix<'_> {
        if let Bytes::Grouped = self.bytes {
            let groups = self.groups.get().and_then(Option::as_ref);
            return QMatrix::from_groups(groups.expect("a grouped weight holds its groups"));
        }
        let m = self.file_matrix();
        let groups = self.groups.get_or_init(|| {
            let g = RowGroups::new(&m);
            if g.as_ref().is_some_and(|g| g.rows() == self.rows) {
                self.bytes.release();
            }
            g
        });
        match groups {
            Some(g) => m
                .with_groups(g)
                .expect("row groups are made from this matrix"),
            None => m,
        }
    }

    fn file_matrix(&self) -> QMatrix<'_> {
        QMatrix::new(self.ty, self.rows, self.cols, self.bytes.as_slice())
            .expect("weight shapes are checked at load")
    }

    /// Makes the row groups now rather than at the first product; returns their bytes (0 where
    /// this weight's products read the stored bytes alone).
    pub fn group_rows(&self) -> usize {
        self.matrix();
        self.groups
            .get()
            .and_then(|g| g.as_ref())
            .map_or(0, RowGroups::size_bytes)
    }

    /// `out[n, rows] = x[n, cols] · selfᵀ`.
    pub fn matmul(&self, x: &[f32], n: usize, out: &mut [f32]) {
        matmul(&self.matrix(), x, n, out)
            .expect("weight shapes are checked at load, activation shapes by the model");
    }

    /// `outs[i] = x · ws[i]ᵀ` for several matrices sharing one input, in one parallel pass.
    pub fn matmul_many(ws: &[&Weight], x: &[f32], n: usize, outs: &mut [&mut [f32]]) {
        let ms: Vec<QMatrix> = ws.iter().map(|w| w.matrix()).collect();
        matmul_many(&ms, x, n, outs)
            .expect("weight shapes are checked at load, activation shapes by the model");
    }

    /// Row `r` as f32 (an embedding lookup). Only a weight held in row groups reads them here:
    /// looking a row up does not regroup a matrix.
    pub fn row(&self, r: usize, out: &mut [f32]) {
        if let Bytes::Grouped = self.bytes {
            return self
                .matrix()
                .dequantize_row(r, out)
                .expect("weights held in groups alone are Q8_0, whose rows they give back");
        }
        let row_bytes = self.bytes.as_slice().len() / self.rows;
        dequantize_row(
            self.ty,
            &self.bytes.as_slice()[r * row_bytes..(r + 1) * row_bytes],
            out,
        )
        .expect("weight shapes are checked at load");
    }

    /// The whole matrix as f32 (for small vectors such as norms and biases).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.rows * self.cols];
        for (r, o) in out.chunks_mut(self.cols).enumerate() {
            self.row(r, o);
        }
        out
    }

    pub fn size_bytes(&self) -> usize {
        match self.bytes {
            Bytes::Grouped => self.group_rows(),
            _ => self.bytes.as_slice().len(),
        }
    }
}
