//! Pool pages listed on the device for the cache-phase kernels (a block per page): copied once
//! a step, read by every layer's launch from the same address, so a captured decode step can
//! include its cache phase.

use cudarc::driver::CudaSlice;

use crate::{CudaError, Device};

/// Pages the first buffer holds.
const MIN_CAPACITY: usize = 256;

#[derive(Default)]
pub struct PageList {
    buf: Option<CudaSlice<u32>>,
    len: usize,
    /// One past the largest page listed: a pool must have at least this many pages.
    bound: usize,
}

impl PageList {
    /// `pages` on the device.
    pub fn new(dev: &Device, pages: &[u32]) -> Result<Self, CudaError> {
        let mut list = Self::default();
        list.load(dev, pages)?;
        Ok(list)
    }

    /// Replaces the list by `pages`, in the same buffer while it is large enough (doubled when
    /// it is not; at least `MIN_CAPACITY`, so that a batch's first decode steps keep one
    /// address and their captured graphs).
    pub fn load(&mut self, dev: &Device, pages: &[u32]) -> Result<(), CudaError> {
        if self.buf.as_ref().is_none_or(|b| b.len() < pages.len()) {
            let cap = (2 * pages.len()).max(MIN_CAPACITY);
            self.buf = Some(dev.zeros(cap)?);
        }
        if let Some(buf) = self.buf.as_mut().filter(|_| !pages.is_empty()) {
            dev.upload(pages, &mut buf.slice_mut(..pages.len()))?;
        }
        self.len = pages.len();
        self.bound = pages.iter().map(|&p| p as usize + 1).max().unwrap_or(0);
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device buffer, when it lists pages that all lie within a pool of `num_pages`.
    pub fn within(&self, num_pages: usize) -> Result<Option<&CudaSlice<u32>>, CudaError> {
        if self.bound > num_pages {
            return Err(CudaError::Invalid("page outside the pool".into()));
        }
        Ok(self.buf.as_ref().filter(|_| self.len > 0))
    }

    /// What a captured launch bakes in: the buffer's address and the number of pages.
    pub fn identity(&self, dev: &Device) -> [u64; 2] {
        let addr = self.buf.as_ref().map_or(0, |b| crate::address(dev, b));
        [addr, self.len as u64]
    }
}
