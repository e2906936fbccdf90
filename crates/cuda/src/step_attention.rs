//! The decode attention of a model step: of two builds of the attention kernel, the one that
//! suits the step's page table.
//!
//! When the step's items fit one round of blocks (rows no longer than the round allows; rows
//! cut into chunks where they are few), one block of 8 warps per item, each warp loading its
//! next page while it works on the current one, is fastest. Measured on an H200 at batch 16:
//! the 2K-token sparse step of Qwen3-8B's geometry at 32K, a row an item, 73.0 against 80.4
//! us; dense at 8K 130.3 against 138.2. On an H100 with Qwen3-8B's geometry, one sequence at
//! 32K (8 rows cut into 128 items) 54.8 against 63.0 us; Qwen2.5-0.5B's (7 query heads over
//! each of 2 KV heads of 64, where the three-block build spills registers) at batch 16, 8K:
//! 33.9 against 51.1 (H200). Steps past one round (128 rows of 2048 pages: dense at 32K,
//! batch 16) run cut into chunks on three 4-warp blocks per multiprocessor: the prefetching
//! build with two blocks was as fast or faster on shuffled pages, but 6% slower on the pages
//! a model's sequences hold (dense Qwen3-1.7B at 32K: 16.3 against 15.3 ms a step). Where a
//! page goes in steps (head_dim 256), the 8-warp build runs every table, its plan cutting rows
//! as it must: Gemma 3's geometry (4 query heads over one KV head of 256) at batch 16 took
//! 57.0 against 73.5 us at 8K and 191.5 against 216.5 at 32K (H100). Both launch as
//! dependents of the kernel before them.

use cudarc::driver::CudaSlice;

use crate::attention::{self, AttnOut, Variant};
use crate::kv_pool::PoolDtype;
use crate::plan::Plan;
use crate::{CudaError, DecodeAttention, Device, DeviceTable, GpuLayerKv};
use vortex_kv::KvGeometry;

/// Eight warps a block, each loading its next page while it works on the current one: for
/// steps that fit one round. Its launch bounds ask for one block a multiprocessor; the plan
/// counts as many as its registers let fit (two for fp8 pages at head_dim 64), or one where
/// that would cut the rows into short chunks (`plan::SHORT_CHUNK_PAGES`).
pub const ONE_ROUND: Variant = Variant {
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
    one_round: Option<DecodeAttention>,
    chunked: DecodeAttention,
    /// Which of the two the loaded plan is for.
    use_one_round: bool,
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
        let one_round = match kernel(dev, geom, dtype, heads_q, ONE_ROUND) {
            Ok(k) => Some(k),
            Err(CudaError::Unsupported(_)) => None,
            Err(e) => return Err(e),
        };
        let mut s = Self {
            one_round,
            chunked,
            use_one_round: false,
        };
        s.set_dependent_launch(true);
        Ok(s)
    }

    /// The same builds with plan buffers of their own, for a second plan in the same step.
    pub fn sibling(&self, dev: &Device) -> Result<Self, CudaError> {
        Ok(Self {
            one_round: self
                .one_round
                .as_ref()
                .map(|w| w.sibling(dev))
                .transpose()?,
            chunked: self.chunked.sibling(dev)?,
            use_one_round: false,
        })
    }

    /// Whether each step's attention may start while the kernel before it drains.
    pub fn set_dependent_launch(&mut self, on: bool) {
        if let Some(w) = &mut self.one_round {
            w.dependent_launch = on;
        }
        self.chunked.dependent_launch = on;
    }

    /// The build and plan for `table`: the one-round build when its plan fits one round,
    /// else chunks on the three-block build; the one-round build for every table where pages
    /// go in steps.
    pub fn choose(&self, table: &DeviceTable) -> (Variant, Plan) {
        if let Some(w) = &self.one_round {
            if attention::pages_in_steps(w.geom) {
                return (ONE_ROUND, w.plan(table));
            }
            if let Some(p) = w.one_round_plan(table) {
                return (ONE_ROUND, p);
            }
        }
        (CHUNKED, self.chunked.plan(table))
    }

    /// Chooses the build for `table` and copies its plan to the device.
    pub fn prepare(&mut self, dev: &Device, table: &DeviceTable) -> Result<(), CudaError> {
        let (variant, plan) = self.choose(table);
        self.use_one_round = variant == ONE_ROUND;
        self.current().load_plan(dev, &plan)
    }

    fn current(&mut self) -> &mut DecodeAttention {
        match &mut self.one_round {
            Some(w) if self.use_one_round => w,
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
        let k = match &self.one_round {
            Some(w) if self.use_one_round => w,
            _ => &self.chunked,
        };
        let mut id = [u64::from(self.use_one_round); 6];
        id[1..].copy_from_slice(&k.launch_identity(dev));
        id
    }
}

#[cfg(test)]
mod tests {
    use crate::plan::{PlanConfig, one_round_plan};

    fn one_round_config() -> PlanConfig {
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
    fn one_round_for_short_steps_and_few_rows() {
        let cfg = one_round_config();
        let fits = |pages: u32, batch: usize, kv_heads: usize| {
            one_round_plan(&vec![pages; batch], 1, kv_heads, &cfg).is_some()
        };
        // Dense at 8K (512 pages a row) and a 2K-token budget (128 pages): a row a block.
        assert!(fits(512, 16, 8));
        assert!(fits(128, 16, 8));
        // Dense at 32K: 128 rows of 2048 pages would need 2048-page items: chunks instead.
        assert!(!fits(2048, 16, 8));
        // Batch 64: 512 rows are more than one round of 132 blocks.
        assert!(!fits(128, 64, 8));
        // Few rows, long ones: cut into one round of chunks (one sequence at 128K, or 16
        // sequences at 32K over two KV heads).
        assert!(fits(8192, 1, 8));
        assert!(fits(2048, 16, 2));
    }
}
