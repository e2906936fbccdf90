//! CSR page tables on the device, the same layout as [`vortex_kv::PageTable`].

use cudarc::driver::CudaSlice;
use vortex_kv::PageTable;

use crate::error::driver;
use crate::{CudaError, Device};

/// A checked page table copied to the device, with the per-row page counts the planner needs.
pub struct DeviceTable {
    pub indptr: CudaSlice<u32>,
    pub indices: CudaSlice<u32>,
    pub last_page_len: CudaSlice<u32>,
    /// For a table an index kernel writes, a flag per row that the kernel sets once the row's
    /// pages are written (`index_row.cu`'s `RowReady`): the attention after it waits for its
    /// row's flag, not for the whole index grid. `None` for a table copied from the host.
    pub ready: Option<CudaSlice<u32>>,
    pub rows_per_seq: usize,
    pub batch: usize,
    /// Pages listed by each row, and the tokens of each row's last page.
    pub row_pages: Vec<u32>,
    pub last_len: Vec<u32>,
    /// The pool shape it was checked against.
    pub kv_heads: usize,
    pub page_size: usize,
    pub num_pages: usize,
}

impl DeviceTable {
    /// Checks `table` against a pool of `num_pages` pages of `page_size` tokens read by
    /// `kv_heads` heads, and copies it to the device.
    pub fn upload(
        dev: &Device,
        table: &PageTable,
        kv_heads: usize,
        page_size: usize,
        num_pages: usize,
    ) -> Result<Self, CudaError> {
        Self::upload_reusing(dev, table, kv_heads, page_size, num_pages, None)
    }

    /// [`upload`](Self::upload) into the buffers of `old` where they are large enough, so a
    /// table that changes step by step keeps its device addresses (as a captured graph needs).
    pub fn upload_reusing(
        dev: &Device,
        table: &PageTable,
        kv_heads: usize,
        page_size: usize,
        num_pages: usize,
        old: Option<Self>,
    ) -> Result<Self, CudaError> {
        check(table, kv_heads, page_size, num_pages)?;
        let (indptr, indices, last_page_len) = match old {
            Some(t) => (Some(t.indptr), Some(t.indices), Some(t.last_page_len)),
            None => (None, None, None),
        };
        Ok(Self {
            indptr: put(dev, indptr, &table.indptr)?,
            indices: put(dev, indices, &table.indices)?,
            last_page_len: put(dev, last_page_len, &table.last_page_len)?,
            ready: None,
            rows_per_seq: table.rows_per_seq,
            batch: table.batch(),
            row_pages: table.indptr.windows(2).map(|w| w[1] - w[0]).collect(),
            last_len: table.last_page_len.clone(),
            kv_heads,
            page_size,
            num_pages,
        })
    }

    /// A table whose rows and last-page lengths are known on the host and whose page indices a
    /// kernel writes (a flow's selection). The pages it will list come from a checked table of
    /// the same pool. `old`'s buffers are reused where large enough.
    pub fn for_selection(
        dev: &Device,
        row_pages: &[u32],
        last_len: &[u32],
        rows_per_seq: usize,
        like: &DeviceTable,
        old: Option<Self>,
    ) -> Result<Self, CudaError> {
        // The kernels index the table with 32-bit signed offsets.
        let mut indptr = vec![0u32];
        let mut sum = 0u64;
        for &n in row_pages {
            sum += u64::from(n);
            if sum > i32::MAX as u64 {
                return Err(CudaError::Invalid(format!(
                    "a selection of more than {} pages in one step",
                    i32::MAX
                )));
            }
            indptr.push(sum as u32);
        }
        let total = (sum as usize).max(1);
        let (old_indptr, old_indices, old_last, old_ready) = match old {
            Some(t) => (
                Some(t.indptr),
                Some(t.indices),
                Some(t.last_page_len),
                t.ready,
            ),
            None => (None, None, None, None),
        };
        let indices = match old_indices {
            Some(b) if b.len() >= total => b,
            _ => grow::<u32>(dev, total)?,
        };
        let ready = match old_ready {
            Some(b) if b.len() >= row_pages.len() => b,
            _ => grow::<u32>(dev, row_pages.len())?,
        };
        Ok(Self {
            indptr: put(dev, old_indptr, &indptr)?,
            indices,
            last_page_len: put(dev, old_last, last_len)?,
            ready: Some(ready),
            rows_per_seq,
            batch: row_pages.len() / rows_per_seq.max(1),
            row_pages: row_pages.to_vec(),
            last_len: last_len.to_vec(),
            kv_heads: like.kv_heads,
            page_size: like.page_size,
            num_pages: like.num_pages,
        })
    }

    /// The table as a CPU page table.
    pub fn download(&self, dev: &Device) -> Result<PageTable, CudaError> {
        let s = &dev.stream;
        let get = |b: &CudaSlice<u32>| s.clone_dtoh(b).map_err(driver("cuMemcpyDtoH"));
        let mut indptr = get(&self.indptr)?;
        indptr.truncate(self.row_pages.len() + 1);
        let mut indices = get(&self.indices)?;
        indices.truncate(*indptr.last().unwrap_or(&0) as usize);
        Ok(PageTable {
            indptr,
            indices,
            last_page_len: self.last_len.clone(),
            rows_per_seq: self.rows_per_seq,
        })
    }

    /// Device addresses of the buffers (they identify a captured graph's inputs).
    pub fn addresses(&self, dev: &Device) -> [u64; 4] {
        [
            crate::address(dev, &self.indptr),
            crate::address(dev, &self.indices),
            crate::address(dev, &self.last_page_len),
            self.ready.as_ref().map_or(0, |r| crate::address(dev, r)),
        ]
    }

    /// What an index kernel writes: the page indices and the rows' ready flags.
    pub fn selection_outputs(
        &mut self,
    ) -> Result<(&mut CudaSlice<u32>, &mut CudaSlice<u32>), CudaError> {
        match &mut self.ready {
            Some(ready) => Ok((&mut self.indices, ready)),
            None => Err(CudaError::Invalid(
                "an index phase writes a table made for a selection".into(),
            )),
        }
    }
}

/// A buffer of at least twice `len` (so a table growing a page at a time rarely moves).
fn grow<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    dev: &Device,
    len: usize,
) -> Result<CudaSlice<T>, CudaError> {
    dev.zeros::<T>(2 * len.max(1))
}

/// `data` copied into `old` when it fits, else into a new buffer.
fn put(
    dev: &Device,
    old: Option<CudaSlice<u32>>,
    data: &[u32],
) -> Result<CudaSlice<u32>, CudaError> {
    let mut buf = match old {
        Some(b) if b.len() >= data.len().max(1) => b,
        _ => grow::<u32>(dev, data.len())?,
    };
    if !data.is_empty() {
        dev.upload(data, &mut buf.slice_mut(..data.len()))?;
    }
    Ok(buf)
}

/// The checks the CPU kernel makes: a kernel must never read outside the pool.
pub fn check(
    table: &PageTable,
    kv_heads: usize,
    page_size: usize,
    num_pages: usize,
) -> Result<(), CudaError> {
    let bad = |s: String| Err(CudaError::Invalid(format!("page table: {s}")));
    if table.rows_per_seq != 1 && table.rows_per_seq != kv_heads {
        return bad(format!(
            "{} rows per sequence; expected 1 or {kv_heads}",
            table.rows_per_seq
        ));
    }
    if table.indptr.first() != Some(&0) {
        return bad("indptr must start at 0".into());
    }
    let rows = table.indptr.len() - 1;
    if table.last_page_len.len() != rows || !rows.is_multiple_of(table.rows_per_seq) {
        return bad(format!(
            "{rows} rows, {} last-page lengths, {} rows per sequence",
            table.last_page_len.len(),
            table.rows_per_seq
        ));
    }
    if *table.indptr.last().unwrap() as usize != table.indices.len() {
        return bad("indptr does not end at the number of indices".into());
    }
    for r in 0..rows {
        let (a, b) = (table.indptr[r], table.indptr[r + 1]);
        if b < a {
            return bad(format!("indptr decreases at row {r}"));
        }
        if a == b {
            return bad(format!("row {r} lists no page"));
        }
        let len = table.last_page_len[r] as usize;
        if len == 0 || len > page_size {
            return bad(format!(
                "row {r}: last page holds {len} tokens, expected 1..={page_size}"
            ));
        }
    }
    if let Some(p) = table.indices.iter().find(|&&p| p as usize >= num_pages) {
        return bad(format!("page {p} is outside the pool of {num_pages} pages"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_tables_are_errors() {
        let table = |pages: &[u32], last: usize| {
            let mut t = PageTable::new(1);
            t.push_row(pages, last);
            t
        };
        assert!(check(&table(&[0, 8], 3), 2, 16, 9).is_ok());
        assert!(
            check(&table(&[0, 9], 3), 2, 16, 9).is_err(),
            "page outside the pool"
        );
        assert!(
            check(&table(&[0], 17), 2, 16, 9).is_err(),
            "last page too long"
        );
        assert!(check(&table(&[0], 0), 2, 16, 9).is_err(), "last page empty");
        assert!(check(&table(&[], 1), 2, 16, 9).is_err(), "empty row");
        let mut t = table(&[0], 1);
        t.rows_per_seq = 3;
        assert!(check(&t, 2, 16, 9).is_err(), "rows per sequence");
    }
}
