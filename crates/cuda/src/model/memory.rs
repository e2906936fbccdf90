//! The KV pool sized to the device memory a server may take.

use vortex_flow::Flow;

use super::GpuModel;
use crate::CudaError;
use crate::error::driver;

/// Device memory left free beyond the share for what a server allocates once it runs: page
/// tables, per-request flow state, captured graphs.
pub const RUNNING_HEADROOM: usize = 512 << 20;

impl GpuModel {
    /// Device bytes one page of the pool takes: its keys and values in every layer, and the
    /// flow's summaries of it.
    pub fn page_bytes(&self) -> usize {
        let kv = Self::kv_bytes_per_layer(self.geom, 1, self.kv_dtype) * self.config.layers;
        kv + self
            .flow
            .summary_bytes()
            .div_ceil(self.allocator.total().max(1))
    }

    /// Replaces the pool by the largest one that leaves `1 - utilization` of the device's
    /// memory free, decoding with `flow`, and returns its pages. What is allocated when this
    /// is called (weights, the working memory [`reserve_steps`](Self::reserve_steps) set
    /// aside) stays; the old pool's memory is counted as free.
    pub fn fill_memory(&mut self, utilization: f64, flow: &Flow) -> Result<usize, CudaError> {
        if !(utilization > 0.0 && utilization <= 1.0) {
            return Err(CudaError::Invalid(format!(
                "a memory utilization of {utilization} (it is a share, above 0 and at most 1)"
            )));
        }
        // Freed memory returns to the device at a synchronisation.
        self.dev.synchronize()?;
        let (free, total) = self
            .dev
            .ctx
            .mem_get_info()
            .map_err(driver("cuMemGetInfo"))?;
        let page = self.page_bytes();
        let pool = self.allocator.total() * page;
        let keep = ((1.0 - utilization) * total as f64) as usize + RUNNING_HEADROOM;
        let room = (free + pool).saturating_sub(keep);
        let pages = (room / page).min(i32::MAX as usize);
        if pages < 2 {
            return Err(CudaError::Invalid(format!(
                "{} MiB of {} MiB free leaves no room for KV pages of {page} bytes at a memory utilization of {utilization}",
                free >> 20,
                total >> 20
            )));
        }
        self.reset(pages, flow)?;
        // The flow's per-sequence buffers grow with the pool: take back what they overran.
        self.dev.synchronize()?;
        let (free, _) = self
            .dev
            .ctx
            .mem_get_info()
            .map_err(driver("cuMemGetInfo"))?;
        if free < keep {
            let pages = pages.saturating_sub((keep - free).div_ceil(page)).max(2);
            self.reset(pages, flow)?;
            return Ok(pages);
        }
        Ok(pages)
    }
}
