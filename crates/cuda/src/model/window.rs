//! Sliding-window layers in a decode pass (Gemma 3's local layers): one table row a sequence
//! lists the pages its window touches, and the attention build with first skips leaves out the
//! first page's tokens before the window.

use vortex_kv::{PageTable, Sequence};

use super::GpuModel;
use crate::{CudaError, DeviceTable};

/// The window table of `seqs` (pages of `page` tokens; a window of `window` positions, the
/// newest token's own included), and each row's last-page length with its first page's skipped
/// tokens in bits 16 and up, as the attention build with first skips reads it.
fn window_rows(seqs: &[&Sequence], page: usize, window: usize) -> (PageTable, Vec<u32>) {
    let mut table = PageTable::new(1);
    let mut packed = Vec::with_capacity(seqs.len());
    for s in seqs {
        let first = s.len.saturating_sub(window);
        let last = s.last_page_len(page);
        table.push_row(&s.pages[first / page..], last);
        packed.push(last as u32 | (((first % page) as u32) << 16));
    }
    (table, packed)
}

impl GpuModel {
    /// The window table of a decode pass and its attention plan, for a model with
    /// sliding-window layers.
    pub(super) fn prepare_window(&mut self, seqs: &[&Sequence]) -> Result<(), CudaError> {
        let (Some(g), Some(attn)) = (self.config.gemma, self.window_attn.as_mut()) else {
            return Ok(());
        };
        if g.window == 0 {
            return Err(CudaError::Invalid(
                "a sliding window of 0 positions (it holds the query's own at least)".into(),
            ));
        }
        let page = self.geom.page_size;
        let (rows, packed) = window_rows(seqs, page, g.window);
        let mut table = DeviceTable::upload_reusing(
            &self.dev,
            &rows,
            self.geom.kv_heads,
            page,
            self.allocator.total(),
            self.window_table.take(),
        )?;
        self.dev
            .upload(&packed, &mut table.last_page_len.slice_mut(..packed.len()))?;
        attn.prepare(&self.dev, &table)?;
        self.window_table = Some(table);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::window_rows;
    use vortex_kv::Sequence;

    #[test]
    fn rows_list_the_pages_the_window_touches() {
        let seq = |len: usize| Sequence {
            pages: (0..len.div_ceil(4) as u32).map(|p| 10 + p).collect(),
            len,
        };
        let (a, b, c, d) = (seq(3), seq(6), seq(7), seq(21));
        // Window 6, pages of 4: 3 tokens fit; 6 tokens start at 0; 7 skip token 0; 21 see
        // positions 15..20, which start at token 3 of page 3.
        let (table, packed) = window_rows(&[&a, &b, &c, &d], 4, 6);
        assert_eq!(table.indptr, [0, 1, 3, 5, 8]);
        assert_eq!(table.indices, [10, 10, 11, 10, 11, 13, 14, 15]);
        assert_eq!(table.last_page_len, [3, 2, 3, 1]);
        assert_eq!(packed, [3, 2, 3 | 1 << 16, 1 | 3 << 16]);
    }
}
