use crate::{PageId, Sequence};

/// A batch's page table in CSR form: row `r` lists pages `indices[indptr[r]..indptr[r + 1]]`,
/// and its last listed page holds `last_page_len[r]` tokens (all others are full).
///
/// A dense table has one row per sequence, shared by all KV heads. A sparse table written by a
/// flow's index phase selects pages per KV head, so it has `batch * kv_heads` rows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageTable {
    pub indptr: Vec<u32>,
    pub indices: Vec<PageId>,
    pub last_page_len: Vec<u32>,
    /// Rows per sequence: 1 (shared by all KV heads) or the number of KV heads.
    pub rows_per_seq: usize,
}

impl PageTable {
    pub fn new(rows_per_seq: usize) -> Self {
        Self {
            indptr: vec![0],
            indices: Vec::new(),
            last_page_len: Vec::new(),
            rows_per_seq,
        }
    }

    /// All pages of every sequence.
    pub fn dense(seqs: &[&Sequence], page_size: usize) -> Self {
        let mut t = Self::new(1);
        for s in seqs {
            t.push_row(&s.pages, s.last_page_len(page_size));
        }
        t
    }

    pub fn push_row(&mut self, pages: &[PageId], last_page_len: usize) {
        self.indices.extend_from_slice(pages);
        self.indptr.push(self.indices.len() as u32);
        self.last_page_len.push(last_page_len as u32);
    }

    pub fn rows(&self) -> usize {
        self.indptr.len() - 1
    }

    pub fn batch(&self) -> usize {
        self.rows() / self.rows_per_seq
    }

    /// The row that KV head `head` of sequence `seq` reads.
    #[inline]
    pub fn row(&self, seq: usize, head: usize) -> usize {
        if self.rows_per_seq == 1 {
            seq
        } else {
            seq * self.rows_per_seq + head
        }
    }

    #[inline]
    pub fn pages(&self, row: usize) -> &[PageId] {
        &self.indices[self.indptr[row] as usize..self.indptr[row + 1] as usize]
    }

    /// Tokens that `row` covers.
    pub fn tokens(&self, row: usize, page_size: usize) -> usize {
        let n = self.pages(row).len();
        if n == 0 {
            0
        } else {
            (n - 1) * page_size + self.last_page_len[row] as usize
        }
    }
}
