//! The decode attention of a model step: of two builds of the attention kernel, the one that
//! suits the step's page table.
//!
//! Measured on an H200 (BENCHMARKS.md, batch 16, Qwen3-8B and Qwen3-1.7B attention geometries):
//! when every (sequence, KV head) row can be one block's whole item in a single round, one
//! block of 8 warps per row, each warp loading its next page while it works on the current one
//! and no split merge, is fastest (the 2K-token sparse step at 32K: 73.0 against 80.4 us;
//! dense at 8K: 130.3 against 138.2 us). Longer rows, or more rows than multiprocessors, run
//! cut into chunks on three 4-warp blocks per multiprocessor: the prefetching build with two
//! blocks was as fast or faster on shuffled pages, but 6% slower on the pages a model's
//! sequences hold (dense Qwen3-1.7B at 32K: 16.3 against 15.3 ms a step). Where a page goes
//! in steps (head_dim 256), the prefetching build runs every table, its plan cutting rows as
//! it must: Gemma 3's geometry (4 query heads over one KV head of 256) at batch 16 took 57.0
//! against 73.5 us at 8K and 191.5 against 216.5 at 32K (H100). Both launch as dependents of
//! the kernel before them.

use cudarc::driver::CudaSlice;

use crate::attention::{self, AttnOut, Variant};
use crate::kv_pool::PoolDtype;
use crate::plan::{self, Plan};
use crate::{CudaError, DecodeAttention, Device, DeviceTable, GpuLayerKv};
use vortex_kv::KvGeometry;

/// One row per block, one round.
pub const WHOLE_ROWS: Variant = Variant {
    warps: 8,
    min_blocks: 1,
    prefetch: true,
};
/// Rows cut into chunks, three blocks per multiprocessor.
pub const CHUNKED: Variant = Variant {
    warps: 4,
    min_blocks: 3,
    prefetch: false,
};

pub struct StepAttention {
    /// `None` where the query heads of a KV head are too many for its eight warps' shared
    /// memory: every step then runs the chunked build.
    whole: Option<DecodeAttention>,
    chunked: DecodeAttention,
    /// Which of the two the loaded plan is for.
    use_whole: bool,
}

impl StepAttention {
    pub fn new(
        dev: &Device,
        geom: KvGeometry,
        dtype: PoolDtype,
        heads_q: usize,
    ) -> Result<Self, CudaError> {
        Self::build(dev, geom, dtype, heads_q, DecodeAttention::new)
    }

    /// The builds for sliding-window layers, whose rows skip leading tokens of their first
    /// page ([`DecodeAttention::with_first_skips`]).
    pub fn with_first_skips(
        dev: &Device,
        geom: KvGeometry,
        dtype: PoolDtype,
        heads_q: usize,
    ) -> Result<Self, CudaError> {
        Self::build(dev, geom, dtype, heads_q, DecodeAttention::with_first_skips)
    }

    fn build(
        dev: &Device,
        geom: KvGeometry,
        dtype: PoolDtype,
        heads_q: usize,
        kernel: fn(
            &Device,
            KvGeometry,
            PoolDtype,
            usize,
            crate::attention::Variant,
        ) -> Result<DecodeAttention, CudaError>,
    ) -> Result<Self, CudaError> {
        let chunked = kernel(dev, geom, dtype, heads_q, CHUNKED)?;
        let whole = match kernel(dev, geom, dtype, heads_q, WHOLE_ROWS) {
            Ok(whole) => Some(whole),
            Err(CudaError::Unsupported(_)) => None,
            Err(e) => return Err(e),
        };
        let mut s = Self {
            whole,
            chunked,
            use_whole: false,
        };
        s.set_dependent_launch(true);
        Ok(s)
    }

    /// The same builds with plan buffers of their own, for a second plan in the same step.
    pub fn sibling(&self, dev: &Device) -> Result<Self, CudaError> {
        Ok(Self {
            whole: self.whole.as_ref().map(|w| w.sibling(dev)).transpose()?,
            chunked: self.chunked.sibling(dev)?,
            use_whole: false,
        })
    }

    /// Whether each step's attention may start while the kernel before it drains.
    pub fn set_dependent_launch(&mut self, on: bool) {
        if let Some(w) = &mut self.whole {
            w.dependent_launch = on;
        }
        self.chunked.dependent_launch = on;
    }

    /// The build and plan for `table`: whole rows when each row is one item of a single
    /// round, else chunks; the prefetching build for every table where pages go in steps.
    pub fn choose(&self, table: &DeviceTable) -> (Variant, Plan) {
        match &self.whole {
            Some(w)
                if attention::pages_in_steps(w.geom)
                    || plan::whole_rows(
                        &table.row_pages,
                        table.rows_per_seq,
                        w.geom.kv_heads,
                        &w.config,
                    ) =>
            {
                (WHOLE_ROWS, w.plan(table))
            }
            _ => (CHUNKED, self.chunked.plan(table)),
        }
    }

    /// Chooses the build for `table` and copies its plan to the device.
    pub fn prepare(&mut self, dev: &Device, table: &DeviceTable) -> Result<(), CudaError> {
        let (variant, plan) = self.choose(table);
        self.use_whole = variant == WHOLE_ROWS;
        self.current().load_plan(dev, &plan)
    }

    fn current(&mut self) -> &mut DecodeAttention {
        match &mut self.whole {
            Some(w) if self.use_whole => w,
            _ => &mut self.chunked,
        }
    }

    /// Runs the prepared plan (see [`DecodeAttention::launch`]).
    pub fn launch<'a>(
        &mut self,
        dev: &Device,
        layer: &GpuLayerKv,
        table: &DeviceTable,
        q: &CudaSlice<f32>,
        scale: f32,
        out: impl Into<AttnOut<'a>>,
    ) -> Result<(), CudaError> {
        self.current().launch(dev, layer, table, q, scale, out)
    }

    /// What a captured launch bakes in: the build chosen and its buffers and plan size.
    pub fn launch_identity(&self, dev: &Device) -> [u64; 6] {
        let k = match &self.whole {
            Some(w) if self.use_whole => w,
            _ => &self.chunked,
        };
        let mut id = [u64::from(self.use_whole); 6];
        id[1..].copy_from_slice(&k.launch_identity(dev));
        id
    }
}

#[cfg(test)]
mod tests {
    use crate::plan::{PlanConfig, whole_rows};

    fn whole_config() -> PlanConfig {
        PlanConfig {
            sms: 132,
            blocks_per_sm: 1,
            waves: 0,
            min_chunk_pages: 16,
            head_split: 1,
        }
    }

    /// The shapes measured on the H200: batch 16 with 8 KV heads is 128 rows.
    #[test]
    fn whole_rows_when_each_row_fits_one_round() {
        let cfg = whole_config();
        let fits = |pages: u32, batch: usize| whole_rows(&vec![pages; batch], 1, 8, &cfg);
        // Dense at 8K (512 pages a row) and a 2K-token budget (128 pages): whole rows.
        assert!(fits(512, 16));
        assert!(fits(128, 16));
        // Dense at 32K: 2048-page rows are cut, so the chunked build runs.
        assert!(!fits(2048, 16));
        // Batch 64: 512 rows are more than one round of 132 blocks.
        assert!(!fits(128, 64));
    }
}
