use crate::KvError;

/// Index of a physical page in the pool.
pub type PageId = u32;

/// Hands out pages and counts their owners; a page returns to the free list when its last owner
/// releases it.
#[derive(Debug, Clone)]
pub struct PageAllocator {
    refs: Vec<u32>,
    free: Vec<PageId>,
}

impl PageAllocator {
    pub fn new(num_pages: usize) -> Self {
        // Pop from the back: hand out low page ids first.
        let free = (0..num_pages as PageId).rev().collect();
        Self {
            refs: vec![0; num_pages],
            free,
        }
    }

    pub fn total(&self) -> usize {
        self.refs.len()
    }

    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    pub fn used_count(&self) -> usize {
        self.total() - self.free_count()
    }

    /// Owners of `page` (0 when free).
    pub fn refs(&self, page: PageId) -> u32 {
        self.refs[page as usize]
    }

    /// Takes a free page with one owner.
    pub fn allocate(&mut self) -> Result<PageId, KvError> {
        let page = self.free.pop().ok_or(KvError::OutOfPages {
            total: self.total(),
        })?;
        self.refs[page as usize] = 1;
        Ok(page)
    }

    /// Adds an owner to a page in use.
    pub fn retain(&mut self, page: PageId) {
        let r = &mut self.refs[page as usize];
        assert!(*r > 0, "retain of free page {page}");
        *r += 1;
    }

    /// Drops one owner; returns true when the page became free.
    pub fn release(&mut self, page: PageId) -> bool {
        let r = &mut self.refs[page as usize];
        assert!(*r > 0, "release of free page {page}");
        *r -= 1;
        if *r == 0 {
            self.free.push(page);
            true
        } else {
            false
        }
    }

    /// Checks internal consistency: every page is either free with no owner or used, never both.
    pub fn check(&self) -> Result<(), String> {
        let mut seen = vec![false; self.total()];
        for &p in &self.free {
            let i = p as usize;
            if i >= self.total() || seen[i] {
                return Err(format!(
                    "page {p} is on the free list twice or out of range"
                ));
            }
            seen[i] = true;
            if self.refs[i] != 0 {
                return Err(format!("free page {p} has {} owners", self.refs[i]));
            }
        }
        for (i, &r) in self.refs.iter().enumerate() {
            if !seen[i] && r == 0 {
                return Err(format!("page {i} has no owner but is not free (leaked)"));
            }
        }
        Ok(())
    }
}
