use crate::PageId;

/// One request's page table: the pages holding its tokens, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sequence {
    pub pages: Vec<PageId>,
    /// Tokens stored.
    pub len: usize,
}

impl Sequence {
    /// Tokens in the last page (0 for an empty sequence).
    pub fn last_page_len(&self, page_size: usize) -> usize {
        if self.len == 0 {
            0
        } else {
            (self.len - 1) % page_size + 1
        }
    }

    /// Pages whose every slot is written.
    pub fn complete_pages(&self, page_size: usize) -> usize {
        self.len / page_size
    }
}
