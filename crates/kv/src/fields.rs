use crate::{KvDtype, PageId, Storage};

/// One per-page summary field a flow declares: `rows x cols` values per page and KV head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldSpec {
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    pub dtype: KvDtype,
}

impl FieldSpec {
    pub fn elems(&self) -> usize {
        self.rows * self.cols
    }
}

/// Per-page summaries of one layer, indexed by physical page like the KV pool itself, so pages
/// shared through a prefix carry their summaries with them (summaries depend only on the page).
/// Layout of each field: `[kv_head][page][rows][cols]`, so that one KV head's summaries of
/// consecutive pages are contiguous: the index phase streams them per KV head.
#[derive(Debug, Clone)]
pub struct PageFields {
    pub specs: Vec<FieldSpec>,
    pub data: Vec<Storage>,
    kv_heads: usize,
    num_pages: usize,
}

impl PageFields {
    pub fn new(specs: Vec<FieldSpec>, kv_heads: usize, num_pages: usize) -> Self {
        let data = specs
            .iter()
            .map(|s| Storage::zeros(s.dtype, num_pages * kv_heads * s.elems()))
            .collect();
        Self {
            specs,
            data,
            kv_heads,
            num_pages,
        }
    }

    pub fn kv_heads(&self) -> usize {
        self.kv_heads
    }

    pub fn num_pages(&self) -> usize {
        self.num_pages
    }

    /// Bytes the fields' values take.
    pub fn bytes(&self) -> usize {
        self.data.iter().map(|d| d.len() * d.dtype().size()).sum()
    }

    /// Offset of `(page, head)` in field `field`.
    #[inline]
    pub fn offset(&self, field: usize, page: PageId, head: usize) -> usize {
        (head * self.num_pages + page as usize) * self.specs[field].elems()
    }

    pub fn write(&mut self, field: usize, page: PageId, head: usize, values: &[f32]) {
        let off = self.offset(field, page, head);
        self.data[field].write_f32(off, values);
    }

    pub fn read(&self, field: usize, page: PageId, head: usize, out: &mut [f32]) {
        let off = self.offset(field, page, head);
        self.data[field].read_f32(off, out);
    }
}
