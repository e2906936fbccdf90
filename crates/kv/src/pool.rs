use crate::{KvDtype, KvError, KvGeometry, PageId, Storage};

/// K and V of one layer for every page of the pool.
///
/// Layout: `[page][kv_head][slot][dim]`, so one KV head's keys of one page are contiguous
/// (`page_size * head_dim` elements): the unit that attention and the cache phase read.
#[derive(Debug, Clone)]
pub struct LayerKv {
    geom: KvGeometry,
    pub k: Storage,
    pub v: Storage,
}

impl LayerKv {
    pub fn new(geom: KvGeometry, dtype: KvDtype, num_pages: usize) -> Self {
        let n = num_pages * geom.page_elems();
        Self {
            geom,
            k: Storage::zeros(dtype, n),
            v: Storage::zeros(dtype, n),
        }
    }

    pub fn geometry(&self) -> KvGeometry {
        self.geom
    }

    pub fn dtype(&self) -> KvDtype {
        self.k.dtype()
    }

    /// Offset of `(page, head)`'s block of `page_size * head_dim` elements.
    #[inline]
    pub fn head_offset(&self, page: PageId, head: usize) -> usize {
        (page as usize * self.geom.kv_heads + head) * self.geom.head_elems()
    }

    /// Writes one token's K and V (`kv_heads * head_dim` each, head-major) at `slot` of `page`.
    pub fn write_token(
        &mut self,
        page: PageId,
        slot: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), KvError> {
        let width = self.geom.kv_heads * self.geom.head_dim;
        for (what, t) in [("key", k), ("value", v)] {
            if t.len() != width {
                return Err(KvError::ShapeMismatch {
                    what,
                    expected: width,
                    got: t.len(),
                });
            }
        }
        let d = self.geom.head_dim;
        for h in 0..self.geom.kv_heads {
            let off = self.head_offset(page, h) + slot * d;
            self.k.write_f32(off, &k[h * d..(h + 1) * d]);
            self.v.write_f32(off, &v[h * d..(h + 1) * d]);
        }
        Ok(())
    }

    /// Copies the first `tokens` slots of every head from page `src` to page `dst`.
    pub fn copy_page(&mut self, src: PageId, dst: PageId, tokens: usize) {
        let n = tokens * self.geom.head_dim;
        for h in 0..self.geom.kv_heads {
            let (s, d) = (self.head_offset(src, h), self.head_offset(dst, h));
            self.k.copy_within(s, d, n);
            self.v.copy_within(s, d, n);
        }
    }
}
