use crate::{KvDtype, KvError, KvGeometry, LayerKv, PageAllocator, PageId, Sequence};

/// Where one appended token goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub page: PageId,
    pub offset: usize,
    /// Writing this slot fills its page: the flow's cache phase can run on it.
    pub completes_page: bool,
}

/// The KV cache of a model: one page allocator shared by all layers, one [`LayerKv`] per layer.
#[derive(Debug, Clone)]
pub struct KvCache {
    geom: KvGeometry,
    alloc: PageAllocator,
    layers: Vec<LayerKv>,
}

impl KvCache {
    pub fn new(geom: KvGeometry, dtype: KvDtype, num_layers: usize, num_pages: usize) -> Self {
        let layers = (0..num_layers)
            .map(|_| LayerKv::new(geom, dtype, num_pages))
            .collect();
        Self {
            geom,
            alloc: PageAllocator::new(num_pages),
            layers,
        }
    }

    pub fn geometry(&self) -> KvGeometry {
        self.geom
    }

    pub fn allocator(&self) -> &PageAllocator {
        &self.alloc
    }

    pub fn layer(&self, i: usize) -> &LayerKv {
        &self.layers[i]
    }

    pub fn layer_mut(&mut self, i: usize) -> &mut LayerKv {
        &mut self.layers[i]
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Pages that appending `tokens` tokens to `seq` would take from the free list.
    pub fn pages_needed(&self, seq: &Sequence, tokens: usize) -> usize {
        let p = self.geom.page_size;
        let new_pages = self.geom.pages_for(seq.len + tokens) - seq.pages.len();
        let cow = tokens > 0
            && !seq.len.is_multiple_of(p)
            && self.alloc.refs(*seq.pages.last().unwrap()) > 1;
        new_pages + cow as usize
    }

    /// Reserves slots for `tokens` more tokens of `seq`: all or nothing.
    pub fn append(&mut self, seq: &mut Sequence, tokens: usize) -> Result<Vec<Slot>, KvError> {
        if self.pages_needed(seq, tokens) > self.alloc.free_count() {
            return Err(KvError::OutOfPages {
                total: self.alloc.total(),
            });
        }
        (0..tokens).map(|_| self.append_one(seq)).collect()
    }

    fn append_one(&mut self, seq: &mut Sequence) -> Result<Slot, KvError> {
        let p = self.geom.page_size;
        let offset = seq.len % p;
        if offset == 0 {
            seq.pages.push(self.alloc.allocate()?);
        } else {
            let last = *seq.pages.last().expect("partial page exists");
            if self.alloc.refs(last) > 1 {
                // Never write into a page another sequence can see: copy it first.
                let fresh = self.alloc.allocate()?;
                for layer in &mut self.layers {
                    layer.copy_page(last, fresh, offset);
                }
                self.alloc.release(last);
                *seq.pages.last_mut().unwrap() = fresh;
            }
        }
        seq.len += 1;
        Ok(Slot {
            page: *seq.pages.last().unwrap(),
            offset,
            completes_page: offset + 1 == p,
        })
    }

    /// A new sequence with the same tokens as `seq`, sharing all of its pages.
    /// A shared partial last page is copied by whichever owner appends to it first.
    pub fn fork(&mut self, seq: &Sequence) -> Sequence {
        for &page in &seq.pages {
            self.alloc.retain(page);
        }
        seq.clone()
    }

    /// A new sequence holding the first `tokens` tokens of `seq` (a shared prefix).
    pub fn fork_prefix(&mut self, seq: &Sequence, tokens: usize) -> Sequence {
        let tokens = tokens.min(seq.len);
        let pages = &seq.pages[..self.geom.pages_for(tokens)];
        for &page in pages {
            self.alloc.retain(page);
        }
        Sequence {
            pages: pages.to_vec(),
            len: tokens,
        }
    }

    /// Takes one more reference to `page` (a holder beside its sequences, e.g. a prefix cache).
    pub fn retain_page(&mut self, page: PageId) {
        self.alloc.retain(page);
    }

    /// Drops one reference to `page`; returns true when it went back to the free list.
    pub fn release_page(&mut self, page: PageId) -> bool {
        self.alloc.release(page)
    }

    /// Releases every page of `seq` and empties it.
    pub fn free(&mut self, seq: &mut Sequence) {
        for page in seq.pages.drain(..) {
            self.alloc.release(page);
        }
        seq.len = 0;
    }
}
