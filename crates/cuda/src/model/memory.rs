//! The KV pool sized to the device memory a server may take.

use vortex_flow::Flow;

use super::{GpuFlow, GpuModel};
use crate::CudaError;

/// Device memory left free beyond the share for what a server allocates once it runs: page
/// tables, per-request flow state, captured graphs.
pub const RUNNING_HEADROOM: usize = 512 << 20;

impl GpuModel {
    /// Device bytes one page of the pool takes: its keys and values in every layer, and the
    /// loaded flows' summaries of it.
    pub fn page_bytes(&self) -> usize {
        let kv = Self::kv_bytes_per_layer(self.geom, 1, self.kv_dtype) * self.config.layers;
        let others = self.others.iter().map(|o| &o.gpu);
        let summaries: usize = std::iter::once(&self.flow)
            .chain(others)
            .map(GpuFlow::summary_bytes)
            .sum();
        kv + summaries.div_ceil(self.allocator.total().max(1))
    }

    /// Device bytes `flow`'s summaries of one page take, over the layers that select.
    fn summary_page_bytes(&self, flow: &Flow) -> Result<usize, CudaError> {
        Ok(self.new_flow(flow, 1)?.summary_bytes())
    }

    /// Replaces the pool by the largest one that leaves `1 - utilization` of the device's
    /// memory free, decoding with `flow`, and returns its pages. What is allocated when this
    /// is called (weights, the working memory [`reserve_steps`](Self::reserve_steps) set
    /// aside) stays; the old pool's memory is counted as free. Room is left for the summaries
    /// of `to_load`, flows the caller [adds](Self::add_flow) next.
    pub fn fill_memory(
        &mut self,
        utilization: f64,
        flow: &Flow,
        to_load: &[Flow],
    ) -> Result<usize, CudaError> {
        if !(utilization > 0.0 && utilization <= 1.0) {
            return Err(CudaError::Invalid(format!(
                "a memory utilization of {utilization} (it is a share, above 0 and at most 1)"
            )));
        }
        let (free, total) = self.dev.memory_info()?;
        let pool = self.allocator.total() * self.page_bytes();
        let mut extra = 0;
        for f in to_load {
            extra += self.summary_page_bytes(f)?;
        }
        let page = self.page_bytes() + extra;
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
        // Flows loaded from now on leave `keep` free, except those room was left for.
        let room: Vec<String> = to_load.iter().map(|f| f.name.clone()).collect();
        self.keep_free = Some((keep, room));
        // The flow's per-sequence buffers grow with the pool: take back what they overran.
        let (free, _) = self.dev.memory_info()?;
        let loads = pages * extra;
        if free < keep + loads {
            let pages = pages
                .saturating_sub((keep + loads - free).div_ceil(page))
                .max(2);
            self.reset(pages, flow)?;
            return Ok(pages);
        }
        Ok(pages)
    }
}
