//! Paged KV cache.
//!
//! A [`KvCache`] owns a pool of pages shared by all layers: page `p` of a sequence holds
//! `page_size` consecutive tokens of K and V for every layer and every KV head. Pages are handed
//! out by a reference-counted [`PageAllocator`], so sequences can share prefix pages. A
//! [`Sequence`] is one request's page table; a batch of them becomes a CSR [`PageTable`].
//! [`vtensor`] gives flows logically contiguous views over these physical pages.

pub mod allocator;
pub mod cache;
pub mod dtype;
pub mod error;
pub mod fields;
pub mod fp8;
pub mod geometry;
pub mod page_table;
pub mod pool;
pub mod sequence;
pub mod vtensor;

pub use allocator::{PageAllocator, PageId};
pub use cache::{KvCache, Slot};
pub use dtype::{KvDtype, KvElem, Storage};
pub use error::KvError;
pub use fields::{FieldSpec, PageFields};
pub use fp8::F8E4M3;
pub use geometry::KvGeometry;
pub use page_table::PageTable;
pub use pool::LayerKv;
pub use sequence::Sequence;
