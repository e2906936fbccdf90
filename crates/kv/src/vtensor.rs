//! vTensor: logically contiguous rank-3 views `[n, rows, cols]` over paged, non-contiguous memory.
//!
//! A flow is written for one sequence and one KV head as if its inputs were contiguous tensors.
//! Each view maps logical block `i` of its first dimension to where it physically lives:
//! - [`Format::PerPage`]: block `i` is logical page `i` of the sequence, found through its page
//!   table (keys, values, or a summary field of that physical page);
//! - [`Format::PerRequest`]: one block per request (a query, a per-request state slot);
//! - [`Format::PerStep`]: contiguous per-step intermediates;
//! - [`Format::Param`]: constants shared by every request.
//!
//! Views never copy: they hold the page list and the storage and compute offsets on access.

use crate::{KvElem, LayerKv, PageFields, PageId, Storage};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    PerPage,
    PerRequest,
    PerStep,
    Param,
}

/// A read-only logical `[n, rows, cols]` tensor.
#[derive(Debug, Clone, Copy)]
pub struct VTensor<'a> {
    pub shape: [usize; 3],
    pub format: Format,
    src: Src<'a>,
}

#[derive(Debug, Clone, Copy)]
enum Src<'a> {
    /// Block `i` starts at `(pages[i] * page_stride + head_offset)` in `storage`.
    Paged {
        storage: &'a Storage,
        pages: &'a [PageId],
        page_stride: usize,
        head_offset: usize,
    },
    Dense(&'a [f32]),
}

impl<'a> VTensor<'a> {
    /// One KV head's keys over the listed pages: `[pages, page_size, head_dim]`.
    pub fn keys(layer: &'a LayerKv, pages: &'a [PageId], head: usize) -> Self {
        Self::kv(layer, &layer.k, pages, head)
    }

    /// One KV head's values over the listed pages: `[pages, page_size, head_dim]`.
    pub fn values(layer: &'a LayerKv, pages: &'a [PageId], head: usize) -> Self {
        Self::kv(layer, &layer.v, pages, head)
    }

    fn kv(layer: &'a LayerKv, storage: &'a Storage, pages: &'a [PageId], head: usize) -> Self {
        let g = layer.geometry();
        Self {
            shape: [pages.len(), g.page_size, g.head_dim],
            format: Format::PerPage,
            src: Src::Paged {
                storage,
                pages,
                page_stride: g.page_elems(),
                head_offset: head * g.head_elems(),
            },
        }
    }

    /// One KV head's summary field `field` over the listed pages: `[pages, rows, cols]`.
    pub fn field(fields: &'a PageFields, field: usize, pages: &'a [PageId], head: usize) -> Self {
        let spec = &fields.specs[field];
        let elems = spec.elems();
        Self {
            shape: [pages.len(), spec.rows, spec.cols],
            format: Format::PerPage,
            src: Src::Paged {
                storage: &fields.data[field],
                pages,
                page_stride: elems,
                head_offset: head * fields.num_pages() * elems,
            },
        }
    }

    /// A contiguous f32 tensor.
    pub fn dense(data: &'a [f32], shape: [usize; 3], format: Format) -> Self {
        assert_eq!(
            data.len(),
            shape.iter().product::<usize>(),
            "dense vTensor shape"
        );
        Self {
            shape,
            format,
            src: Src::Dense(data),
        }
    }

    pub fn block_elems(&self) -> usize {
        self.shape[1] * self.shape[2]
    }

    /// Offset of block `i` in the underlying storage.
    #[inline]
    fn offset(&self, i: usize) -> usize {
        match self.src {
            Src::Paged {
                pages,
                page_stride,
                head_offset,
                ..
            } => pages[i] as usize * page_stride + head_offset,
            Src::Dense(_) => i * self.block_elems(),
        }
    }

    /// Block `i` (`rows x cols`, row-major) in its stored dtype, if that dtype is `T`.
    #[inline]
    pub fn block<T: KvElem>(&self, i: usize) -> Option<&'a [T]> {
        let off = self.offset(i);
        let n = self.block_elems();
        match self.src {
            Src::Paged { storage, .. } => storage.as_slice::<T>().map(|s| &s[off..off + n]),
            Src::Dense(d) => {
                let s: &[f32] = &d[off..off + n];
                // SAFETY: reinterpreting only when T is f32.
                (T::DTYPE == f32::DTYPE)
                    .then(|| unsafe { std::slice::from_raw_parts(s.as_ptr() as *const T, n) })
            }
        }
    }

    /// The stored dtype of a paged view (`None` for dense f32 views).
    pub fn storage_dtype(&self) -> Option<crate::KvDtype> {
        match self.src {
            Src::Paged { storage, .. } => Some(storage.dtype()),
            Src::Dense(_) => None,
        }
    }

    /// Asks the CPU to start loading block `i` into cache.
    #[inline]
    pub fn prefetch(&self, i: usize) {
        #[cfg(target_arch = "x86_64")]
        if let Src::Paged { storage, .. } = self.src {
            let off = self.offset(i) * storage.dtype().size();
            let base = match storage {
                Storage::F32(v) => v.as_ptr() as *const i8,
                Storage::F16(v) => v.as_ptr() as *const i8,
                Storage::Bf16(v) => v.as_ptr() as *const i8,
                Storage::Fp8(v) => v.as_ptr() as *const i8,
            };
            let bytes = self.block_elems() * storage.dtype().size();
            for line in (0..bytes).step_by(64) {
                // SAFETY: prefetching is a hint: it never faults, even outside the buffer, and
                // `off + line` stays within block `i`.
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                        base.wrapping_add(off + line),
                    )
                };
            }
        }
    }

    /// Block `i` converted to f32.
    pub fn read_block(&self, i: usize, out: &mut [f32]) {
        let off = self.offset(i);
        match self.src {
            Src::Paged { storage, .. } => storage.read_f32(off, &mut out[..self.block_elems()]),
            Src::Dense(d) => out.copy_from_slice(&d[off..off + self.block_elems()]),
        }
    }
}
