//! Paged decode attention on the GPU over dense or sparse CSR page tables.

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig};
use half::bf16;

use crate::blas::{F16_INPUT_SHIFT, Input};
use crate::compile::{ModuleSpec, build};
use crate::error::driver;
use crate::kv_pool::{KV_ELEM, PoolDtype};
use crate::launch::{self, RawArgs};
use crate::layer_kernels::INPUT16;
use crate::plan::{self, Plan, PlanConfig, WorkItem};
use crate::{CudaError, Device, DeviceTable, GpuLayerKv, MMA, MMA_KEYS};
use std::sync::LazyLock;
use vortex_kv::KvGeometry;

static SOURCE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{KV_ELEM}\n{INPUT16}\n{MMA}\n{MMA_KEYS}\n{}\n{}",
        include_str!("kernels/attention_mma.cu"),
        include_str!("kernels/attention.cu")
    )
});
/// Static shared memory a block may use without opting in.
const SMEM_LIMIT: usize = 48 << 10;

/// How the kernel is built: warps per block (they share one work item's pages), blocks per
/// multiprocessor its registers must leave room for, and whether each warp loads its next page
/// while it works on the current one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    pub warps: usize,
    pub min_blocks: usize,
    pub prefetch: bool,
}

impl Default for Variant {
    fn default() -> Self {
        crate::step_attention::CHUNKED
    }
}

/// `VORTEX_WAIT_WHOLE_INDEX=1` makes the attention wait for the whole index grid before it
/// reads a selected table, as if its rows had no ready flags (to compare the two). Read once:
/// every decode step's attention asks.
static WAIT_WHOLE_INDEX: LazyLock<bool> =
    LazyLock::new(|| std::env::var_os("VORTEX_WAIT_WHOLE_INDEX").is_some_and(|v| v != "0"));

/// Whether the attention waits for the whole grid before it (`VORTEX_WAIT_WHOLE_INDEX`): then
/// that grid must be the last to finish of a table's index launches, so none may run beside
/// another.
pub(crate) fn waits_whole_index() -> bool {
    *WAIT_WHOLE_INDEX
}

/// `VORTEX_NO_MMA_ATTENTION=1` keeps pages on the CUDA cores (to compare the two).
fn cuda_core_pages() -> bool {
    std::env::var_os("VORTEX_NO_MMA_ATTENTION").is_some_and(|v| v != "0")
}

/// Whether the kernel takes its pages' products on the tensor cores, for `group` query heads per
/// KV head (each work item takes `group / head_split(group)` of them): the condition of
/// `attention_mma.cu`, repeated here for reports.
pub fn tensor_core_pages(
    geom: KvGeometry,
    dtype: PoolDtype,
    group: usize,
    capability: (i32, i32),
) -> bool {
    let group = group / head_split(group);
    let (fewest, arch) = match dtype {
        PoolDtype::Fp8 => (1, (8, 9)),
        PoolDtype::Bf16 => (5, (8, 0)),
    };
    matches!(geom.head_dim, 64 | 128)
        && geom.page_size == 16
        && (fewest..=8).contains(&group)
        && capability >= arch
        && !cuda_core_pages()
}

/// Whether a warp takes each page's K and V in several steps (`STEPS` in `attention.cu`): a
/// page of more than 8 loads of 32 lanes' 8 values, as 16 tokens at head_dim 256.
pub fn pages_in_steps(geom: KvGeometry) -> bool {
    geom.page_size * geom.head_dim > 8 * 256
}

/// The widest group of query heads one work item takes: the tensor-core page loop's rows hold
/// up to 8 heads.
const ITEM_GROUP: usize = 8;

/// Work items per KV head for `group` query heads per KV head: the fewest that split it into
/// equal groups of at most `ITEM_GROUP` heads. Each reads the KV head's pages; run side by
/// side, all but the first find them in L2.
pub fn head_split(group: usize) -> usize {
    (1..=group.max(1))
        .find(|s| group.is_multiple_of(*s) && group / s <= ITEM_GROUP)
        .unwrap_or(1)
}

/// The kernel source for a geometry and pool element type, `group` query heads per KV head, and
/// a variant.
pub fn module_spec(
    geom: KvGeometry,
    dtype: PoolDtype,
    group: usize,
    variant: Variant,
) -> ModuleSpec<'static> {
    module_spec_with(geom, dtype, group, variant, false)
}

/// [`module_spec`]; with `first_skips` the build for sliding-window layers, whose rows skip
/// leading tokens of their first page (the count in bits 16 and up of the last page's length).
pub fn module_spec_with(
    geom: KvGeometry,
    dtype: PoolDtype,
    group: usize,
    variant: Variant,
    first_skips: bool,
) -> ModuleSpec<'static> {
    let split = head_split(group);
    let group = group / split;
    ModuleSpec {
        name: "attention.cu",
        source: SOURCE.as_str(),
        defines: vec![
            dtype.define(),
            ("HEAD_DIM", geom.head_dim.to_string()),
            ("PAGE_SIZE", geom.page_size.to_string()),
            ("GROUP", group.to_string()),
            ("KV_SPLIT", split.to_string()),
            ("WARPS", variant.warps.to_string()),
            ("MIN_BLOCKS", variant.min_blocks.to_string()),
            ("PREFETCH", u8::from(variant.prefetch).to_string()),
            ("F16_INPUT_SHIFT", F16_INPUT_SHIFT.to_string()),
        ]
        .into_iter()
        .chain((cuda_core_pages() || first_skips).then(|| ("NO_MMA_PAGES", "1".to_string())))
        .chain(first_skips.then(|| ("FIRST_SKIPS", "1".to_string())))
        .collect(),
    }
}

/// Where a launch writes the output: f32 (`[batch, heads_q, head_dim]`, exactly), or as the
/// next product's input (at least as many values).
pub enum AttnOut<'a> {
    F32(&'a mut CudaSlice<f32>),
    Input(&'a mut CudaSlice<bf16>, Input),
}

impl<'a> From<&'a mut CudaSlice<f32>> for AttnOut<'a> {
    fn from(out: &'a mut CudaSlice<f32>) -> Self {
        AttnOut::F32(out)
    }
}

impl AttnOut<'_> {
    fn len(&self) -> usize {
        match self {
            AttnOut::F32(o) => o.len(),
            AttnOut::Input(o, _) => o.len(),
        }
    }

    fn f32(&self) -> Option<&CudaSlice<f32>> {
        match self {
            AttnOut::F32(o) => Some(o),
            AttnOut::Input(..) => None,
        }
    }

    fn input(&self) -> Option<(&CudaSlice<bf16>, Input)> {
        match self {
            AttnOut::F32(_) => None,
            AttnOut::Input(o, i) => Some((o, *i)),
        }
    }
}

/// The decode-attention kernel for one geometry, with its planner and scratch buffers.
pub struct DecodeAttention {
    /// The kernel for tables without ready flags, and the one that waits for each row's flag.
    func: CudaFunction,
    func_ready: CudaFunction,
    pub geom: KvGeometry,
    pub dtype: PoolDtype,
    pub heads_q: usize,
    pub warps: usize,
    pub variant: Variant,
    /// Registers per thread of the compiled kernel.
    pub registers: i32,
    /// Local memory per thread of either kernel: registers spilled, or arrays the compiler could
    /// not keep in them (0 when it holds everything in registers).
    pub local_bytes: i32,
    /// Whether the pages' products run on the tensor cores ([`tensor_core_pages`]).
    pub tensor_cores: bool,
    pub config: PlanConfig,
    work: CudaSlice<WorkItem>,
    part_o: CudaSlice<f32>,
    part_lse: CudaSlice<f32>,
    counters: CudaSlice<u32>,
    blocks: usize,
    /// Launch so that the grid may start while the stream's previous kernel drains
    /// ([`crate::launch`]); ignored on devices before compute capability 9.0.
    pub dependent_launch: bool,
    /// Whether the kernel came from the disk cache, and how long loading it took.
    pub from_cache: bool,
    pub build_seconds: f64,
}

impl DecodeAttention {
    /// Compiles (or loads from the cache) the kernel for a `geom` pool of `dtype` elements with
    /// `heads_q` query heads.
    pub fn new(
        dev: &Device,
        geom: KvGeometry,
        dtype: PoolDtype,
        heads_q: usize,
        variant: Variant,
    ) -> Result<Self, CudaError> {
        Self::build(dev, geom, dtype, heads_q, variant, false)
    }

    /// [`new`](Self::new) for sliding-window layers: each row's last-page length holds, in bits
    /// 16 and up, the leading tokens of its first page that lie before the window.
    pub fn with_first_skips(
        dev: &Device,
        geom: KvGeometry,
        dtype: PoolDtype,
        heads_q: usize,
        variant: Variant,
    ) -> Result<Self, CudaError> {
        Self::build(dev, geom, dtype, heads_q, variant, true)
    }

    fn build(
        dev: &Device,
        geom: KvGeometry,
        dtype: PoolDtype,
        heads_q: usize,
        variant: Variant,
        first_skips: bool,
    ) -> Result<Self, CudaError> {
        let d = geom.head_dim;
        if !(d.is_multiple_of(8) && d >= 8 && 32 % (d / 8) == 0) {
            return Err(CudaError::Unsupported(format!(
                "head_dim {d} (decode attention handles 8, 16, 32, 64, 128 and 256)"
            )));
        }
        if heads_q == 0 || !heads_q.is_multiple_of(geom.kv_heads) {
            return Err(CudaError::Invalid(format!(
                "{heads_q} query heads are not a positive multiple of {} KV heads",
                geom.kv_heads
            )));
        }
        let full_group = heads_q / geom.kv_heads;
        let split = head_split(full_group);
        let group = full_group / split;
        let warps = variant.warps;
        if !(1..=32).contains(&warps) || !(1..=32).contains(&variant.min_blocks) {
            return Err(CudaError::Invalid(format!("kernel variant {variant:?}")));
        }
        // Per warp and head a row of partial outputs, its max and sum; per head the row merge's
        // max and inverse sum; the merge flag.
        if ((warps * (d + 2) + 2) * group + 1) * 4 > SMEM_LIMIT {
            return Err(CudaError::Unsupported(format!(
                "{group} query heads per KV head at head_dim {d} with {warps} warps"
            )));
        }
        let spec = module_spec_with(geom, dtype, full_group, variant, first_skips);
        let built = build(dev, &spec)?;
        let func = built.function("paged_decode")?;
        let func_ready = built.function("paged_decode_ready")?;
        // The plan assumes what both kernels can hold on a multiprocessor.
        let mut blocks_per_sm = usize::MAX;
        for f in [&func, &func_ready] {
            let n = f
                .occupancy_max_active_blocks_per_multiprocessor((warps * 32) as u32, 0, None)
                .map_err(driver("cuOccupancyMaxActiveBlocksPerMultiprocessor"))?;
            blocks_per_sm = blocks_per_sm.min(n.max(1) as usize);
        }
        let registers = func.num_regs().map_err(driver("cuFuncGetAttribute"))?;
        let mut local_bytes = 0;
        for f in [&func, &func_ready] {
            let n = f.local_size_bytes().map_err(driver("cuFuncGetAttribute"))?;
            local_bytes = local_bytes.max(n);
        }
        Ok(Self {
            func,
            func_ready,
            geom,
            dtype,
            heads_q,
            warps,
            variant,
            registers,
            local_bytes,
            tensor_cores: !first_skips && tensor_core_pages(geom, dtype, group, dev.capability),
            config: PlanConfig {
                sms: dev.sms,
                blocks_per_sm,
                waves: 0,
                min_chunk_pages: 2 * warps,
                head_split: split,
            },
            work: dev.zeros(1)?,
            part_o: dev.zeros(1)?,
            part_lse: dev.zeros(1)?,
            counters: dev.zeros(1)?,
            blocks: 0,
            dependent_launch: false,
            from_cache: built.from_cache,
            build_seconds: built.seconds,
        })
    }

    /// The same kernels with plan buffers of its own, for a second plan in the same step.
    pub fn sibling(&self, dev: &Device) -> Result<Self, CudaError> {
        Ok(Self {
            func: self.func.clone(),
            func_ready: self.func_ready.clone(),
            work: dev.zeros(1)?,
            part_o: dev.zeros(1)?,
            part_lse: dev.zeros(1)?,
            counters: dev.zeros(1)?,
            blocks: 0,
            ..*self
        })
    }

    /// Query heads one work item takes.
    pub fn group(&self) -> usize {
        self.heads_q / self.geom.kv_heads / self.config.head_split
    }

    /// What a captured launch bakes in: the scratch buffers' addresses and the loaded plan's
    /// size.
    pub fn launch_identity(&self, dev: &Device) -> [u64; 5] {
        [
            crate::address(dev, &self.work),
            crate::address(dev, &self.part_o),
            crate::address(dev, &self.part_lse),
            crate::address(dev, &self.counters),
            self.blocks as u64,
        ]
    }

    /// Plans a step over `table`.
    pub fn plan(&self, table: &DeviceTable) -> Plan {
        plan::plan(
            &table.row_pages,
            table.rows_per_seq,
            self.geom.kv_heads,
            &self.config,
        )
    }

    /// The plan of a step over `table` when it fits one round of blocks.
    pub fn one_round_plan(&self, table: &DeviceTable) -> Option<Plan> {
        plan::one_round_plan(
            &table.row_pages,
            table.rows_per_seq,
            self.geom.kv_heads,
            &self.config,
        )
    }

    /// Copies a plan to the device, growing the scratch buffers when needed.
    pub fn load_plan(&mut self, dev: &Device, plan: &Plan) -> Result<(), CudaError> {
        let item_elems = self.group() * self.geom.head_dim;
        if self.work.len() < plan.items.len() {
            self.work = dev.zeros(plan.items.len())?;
        }
        if self.counters.len() < plan.partials {
            self.part_o = dev.zeros(plan.partials * item_elems)?;
            self.part_lse = dev.zeros(plan.partials * self.group())?;
            self.counters = dev.zeros(plan.partials)?;
        }
        if !plan.items.is_empty() {
            dev.upload(&plan.items, &mut self.work.slice_mut(..plan.items.len()))?;
        }
        self.blocks = plan.items.len();
        Ok(())
    }

    /// Runs the loaded plan: `out[s][h] = softmax(scale * K q[s][h]) V` over the pages that
    /// `table` lists for sequence `s` and KV head `h / group`. `q` is f32
    /// `[batch, heads_q, head_dim]`, and so is `out` unless it is the next product's input.
    pub fn launch<'a>(
        &mut self,
        dev: &Device,
        layer: &GpuLayerKv,
        table: &DeviceTable,
        q: &CudaSlice<f32>,
        scale: f32,
        out: impl Into<AttnOut<'a>>,
    ) -> Result<(), CudaError> {
        let out = out.into();
        if layer.geom != self.geom || layer.dtype != self.dtype {
            return Err(CudaError::Invalid(format!(
                "attention built for {:?} {} cannot read a {:?} {} pool",
                self.geom, self.dtype, layer.geom, layer.dtype
            )));
        }
        if table.kv_heads != self.geom.kv_heads
            || table.page_size != self.geom.page_size
            || table.num_pages > layer.num_pages
        {
            return Err(CudaError::Invalid(
                "page table was checked against another pool".into(),
            ));
        }
        let elems = table.batch * self.heads_q * self.geom.head_dim;
        // A product's input may be a longer buffer, as the product reads only its rows.
        let out_fits = match &out {
            AttnOut::F32(o) => o.len() == elems,
            AttnOut::Input(o, _) => o.len() >= elems,
        };
        if q.len() != elems || !out_fits {
            return Err(CudaError::Invalid(format!(
                "query and output must hold {elems} values, got {} and {}",
                q.len(),
                out.len()
            )));
        }
        if self.blocks == 0 {
            return Ok(());
        }
        // Items per sequence; the kernel divides by KV_SPLIT for the pool's KV heads.
        let kv_heads = (self.geom.kv_heads * self.config.head_split) as i32;
        let items = self.blocks as u32;
        let scale_log2 = scale * std::f32::consts::LOG2_E;
        let cfg = LaunchConfig {
            grid_dim: (items, 1, 1),
            block_dim: ((self.warps * 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let ready = table.ready.as_ref().filter(|_| !*WAIT_WHOLE_INDEX);
        let mut a = RawArgs::default();
        a.buf(dev, &layer.k)
            .buf(dev, &layer.v)
            .buf(dev, &table.indptr)
            .buf(dev, &table.indices)
            .buf(dev, &table.last_page_len)
            .buf(dev, q)
            .buf(dev, &self.work)
            .u32(items)
            .i32(kv_heads)
            .f32(scale_log2)
            .buf_or_null(dev, out.f32())
            .buf(dev, &self.part_o)
            .buf(dev, &self.part_lse)
            .buf(dev, &self.counters)
            .buf_or_null(dev, ready)
            .buf_or_null(dev, out.input().map(|(o, _)| o))
            .i32(out.input().map_or(0, |(_, i)| i.f16_flag()));
        let func = if ready.is_some() {
            &self.func_ready
        } else {
            &self.func
        };
        // SAFETY: the arguments match the kernels' parameters; the table was checked against
        // the pool on upload and the plan was made from that table; the kernel waits for its
        // predecessor before reading anything (then no index launch ran beside another), or,
        // for a table with ready flags, for the flag of its row, which the index kernel that
        // writes the row clears before this grid may start.
        unsafe { launch::launch(dev, func, cfg, &mut a, self.dependent_launch) }
    }

    /// Plans, loads the plan and launches: one decode step of one layer.
    pub fn run(
        &mut self,
        dev: &Device,
        layer: &GpuLayerKv,
        table: &DeviceTable,
        q: &CudaSlice<f32>,
        scale: f32,
        out: &mut CudaSlice<f32>,
    ) -> Result<Plan, CudaError> {
        let plan = self.plan(table);
        self.load_plan(dev, &plan)?;
        self.launch(dev, layer, table, q, scale, out)?;
        Ok(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::{head_split, pages_in_steps, tensor_core_pages};
    use crate::kv_pool::PoolDtype::{Bf16, Fp8};
    use vortex_kv::KvGeometry;

    /// The pools and geometries `attention_mma.cu` takes, as measured worth it (BENCHMARKS.md):
    /// fp8 at any group up to 8 on compute capability 8.9; bf16 only from 5 query heads per KV
    /// head, where the CUDA-core loop is bound by its instructions; head_dim 64 or 128.
    #[test]
    fn tensor_core_pages_where_the_cuda_cores_fall_short() {
        if std::env::var_os("VORTEX_NO_MMA_ATTENTION").is_some() {
            return; // the switch turns every case off
        }
        let g = KvGeometry::new(8, 128, 16).unwrap();
        let hopper = (9, 0);
        for group in 1..=8 {
            assert!(tensor_core_pages(g, Fp8, group, hopper));
            assert_eq!(tensor_core_pages(g, Bf16, group, hopper), group >= 5);
        }
        // Wider groups split into items of at most 8 heads: 16 as 2 x 8, 10 as 2 x 5, 9 as
        // 3 x 3 (CUDA cores for bf16).
        assert_eq!((head_split(16), head_split(10), head_split(9)), (2, 2, 3));
        assert_eq!((head_split(8), head_split(1), head_split(13)), (1, 1, 13));
        assert!(tensor_core_pages(g, Fp8, 9, hopper));
        assert!(tensor_core_pages(g, Bf16, 16, hopper));
        assert!(tensor_core_pages(g, Bf16, 10, hopper));
        assert!(!tensor_core_pages(g, Bf16, 9, hopper));
        // Ampere: bf16 products, but no hardware e4m3 widening.
        assert!(tensor_core_pages(g, Bf16, 8, (8, 0)));
        assert!(!tensor_core_pages(g, Fp8, 4, (8, 0)));
        // head_dim 64 as 128 (Qwen2.5-0.5B's 7 query heads over each KV head, SmolLM2's 3).
        let narrow = KvGeometry::new(2, 64, 16).unwrap();
        assert!(tensor_core_pages(narrow, Bf16, 7, hopper));
        assert!(!tensor_core_pages(narrow, Bf16, 4, hopper));
        assert!(tensor_core_pages(narrow, Fp8, 3, hopper));
        // Other head widths and page sizes keep the CUDA-core loop.
        for (dim, page) in [(64, 8), (128, 8), (256, 16), (32, 16)] {
            let other = KvGeometry::new(8, dim, page).unwrap();
            assert!(!tensor_core_pages(other, Fp8, 4, hopper));
            assert!(!tensor_core_pages(other, Bf16, 8, hopper));
        }
    }

    /// Pages of more than 8 loads a lane (8 values each, 32 lanes a load) go in steps.
    #[test]
    fn pages_in_steps_past_eight_loads() {
        let g = |dim, page| KvGeometry::new(1, dim, page).unwrap();
        assert!(!pages_in_steps(g(128, 16)));
        assert!(!pages_in_steps(g(64, 32)));
        assert!(pages_in_steps(g(256, 16)));
        assert!(pages_in_steps(g(128, 32)));
    }
}
