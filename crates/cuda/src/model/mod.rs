//! A decoder model on the GPU: weights, the paged KV pool of every layer, and the forward pass
//! (chunked prefill with causal attention, decode steps with the flow's sparse attention).

mod ahead;
mod flow;
mod flows;
mod forward;
mod graphs;
mod logprobs;
mod memory;
mod outputs;
mod profile;
mod prompt_scores;
mod recall;
mod scratch;
mod selection;
mod serve;
mod weights;
mod window;

pub use flow::{GenFlow, GpuFlow, IndexedFlow, index_kernel};
pub use flows::OtherFlow;
use flows::{flow_in, no_flow};
pub use memory::RUNNING_HEADROOM;
use outputs::host_prefix;
pub use profile::{Profiler, STAGES, Stage};
pub use recall::StepRecall;
pub use serve::CudaPass;
pub use weights::{GpuLayer, GpuWeights};

use cudarc::driver::PinnedHostSlice;
use vortex_flow::Flow;
use vortex_flow::state::StateSlot;
use vortex_kv::{KvGeometry, PageAllocator, Sequence};
use vortex_model::config::{ModelConfig, RopeStyle};
use vortex_model::layers::Rope;

use crate::blas::Blas;
use crate::error::driver;
use crate::kv_pool::PoolDtype;
use crate::layer_kernels::{LayerKernels, RopeTable};
use crate::page_list::PageList;
use crate::prefill::PrefillAttention;
use crate::sampling::SamplingKernels;
use crate::step_attention::StepAttention;
use crate::{CudaError, Device, DeviceTable, GpuLayerKv, KvKernels};
use ahead::Ahead;
use graphs::{CapturePolicy, StepGraph};
use scratch::Scratch;
use selection::Selection;

/// One sequence's part of a pass whose pages are in place: `seq.len` counts the new tokens.
pub struct PlacedStep<'a> {
    pub seq: &'a Sequence,
    pub tokens: &'a [u32],
    /// This sequence's flow settings (budget, sinks, ...); `None` takes the flow's own.
    pub settings: Option<&'a vortex_flow::Settings>,
    /// The request's state slot, for a flow that keeps state ([`GpuModel::state_slot_for`]).
    pub state: Option<&'a StateSlot>,
    /// The flow it decodes with: 0 the model's own, `i` the `i`th of [`GpuModel::add_flow`].
    pub flow: usize,
}

/// The KV pool of a model: pages of `page_size` tokens, `num_pages` per layer, each element
/// stored as `dtype`.
#[derive(Debug, Clone, Copy)]
pub struct PoolSpec {
    pub page_size: usize,
    pub num_pages: usize,
    pub dtype: PoolDtype,
}

/// One sequence's part of a forward pass: the tokens to append to it.
pub struct GpuStep<'a> {
    pub seq: &'a mut Sequence,
    pub tokens: &'a [u32],
    /// The request's state slot, for a flow that keeps state ([`GpuModel::state_slot_for`]).
    pub state: Option<&'a StateSlot>,
    /// The flow it decodes with, as [`PlacedStep::flow`].
    pub flow: usize,
}

pub struct GpuModel {
    pub dev: Device,
    pub config: ModelConfig,
    pub weights: GpuWeights,
    pub kv: Vec<GpuLayerKv>,
    pub allocator: PageAllocator,
    /// The flow sequences decode with unless they choose another (flow 0).
    pub flow: GpuFlow,
    /// Flows 1.. ([`add_flow`](Self::add_flow)).
    pub others: Vec<OtherFlow>,
    pub geom: KvGeometry,
    pub kv_dtype: PoolDtype,
    blas: Blas,
    layer_kernels: LayerKernels,
    sampling: SamplingKernels,
    kv_kernels: KvKernels,
    rope: RopeTable,
    /// The rotation of sliding-window layers, where it differs (Gemma 3).
    rope_local: Option<RopeTable>,
    prefill: PrefillAttention,
    dense_attn: StepAttention,
    /// Sliding-window layers' decode attention and the pass's window table (Gemma 3).
    window_attn: Option<StepAttention>,
    window_table: Option<DeviceTable>,
    scratch: Scratch,
    /// Rows of the last forward pass's logits.
    logit_rows: usize,
    /// Token rows of the last forward pass, whose final hidden states `scratch.x` holds.
    pass_rows: usize,
    /// Page-locked host memory the logits are copied through (grown on demand).
    host_logits: Option<PinnedHostSlice<f32>>,
    /// Log-probabilities' kernels (compiled when a request first asks for them) and buffers.
    logprobs: Option<
        Box<(
            crate::logprobs::LogprobKernels,
            crate::logprobs::RowLogprobs,
        )>,
    >,
    /// Those of tokens picked ahead, on their way back.
    logprobs_in_flight: logprobs::LogprobsBack,
    /// Those of prompt rows ([`score_rows`](Self::score_rows)).
    prompt_scores: prompt_scores::PromptScores,
    /// When set, forward passes record their stages' device time here.
    pub profiler: Option<Profiler>,
    /// Replay decode steps as CUDA graphs (on by default).
    pub use_graphs: bool,
    /// Graphs captured so far (a new one whenever a step's launches differ from those kept).
    pub graphs_captured: usize,
    /// The last captured decode passes, most recently used last.
    graphs: Vec<StepGraph>,
    capture: CapturePolicy,
    /// Bumped when the pool or the flow is replaced: captured launches name their buffers.
    generation: u64,
    /// The step's tables and selection rows, kept so their device addresses stay put.
    dense_table: Option<DeviceTable>,
    /// The step's selections, the first `active_selections` in use (kept so that their
    /// device addresses stay put; there is always one).
    selections: Vec<Selection>,
    active_selections: usize,
    /// Tokens picked on the device for the next pass.
    ahead: Ahead,
    /// Measures a decode pass when asked ([`measure_next_decode`](Self::measure_next_decode)).
    recall: recall::RecallProbe,
    /// Once [`fill_memory`](Self::fill_memory) has sized the pool: the device bytes a flow
    /// loaded later must leave free (the memory share's complement and the running headroom),
    /// and the flows it left room for, which need not.
    keep_free: Option<(usize, Vec<String>)>,
}

/// Where the weights come from.
pub enum WeightSource<'a> {
    /// A loaded model's, dequantized to bf16.
    Model(&'a vortex_model::model::Model),
    /// Drawn on the device from a seed.
    Random(u64),
}

impl GpuModel {
    /// The model on `dev` with a pool of `num_pages` pages of `page_size` tokens per layer,
    /// stored as `kv_dtype`, decoding with `flow` (checked for this model's geometry).
    pub fn new(
        dev: Device,
        config: ModelConfig,
        source: WeightSource,
        pool: PoolSpec,
        flow: &Flow,
    ) -> Result<Self, CudaError> {
        let PoolSpec {
            page_size,
            num_pages,
            dtype: kv_dtype,
        } = pool;
        let geom = KvGeometry::new(config.heads_kv, config.head_dim, page_size)
            .map_err(|e| CudaError::Invalid(e.to_string()))?;
        // Positions reach the kernels as 32-bit signed integers.
        if config.max_positions > i32::MAX as usize {
            return Err(CudaError::Invalid(format!(
                "a context of {} positions (at most {} on CUDA)",
                config.max_positions,
                i32::MAX
            )));
        }
        let layer_kernels = LayerKernels::new(&dev, config.head_dim, page_size, kv_dtype)?;
        let kv_kernels = KvKernels::new(&dev, geom, kv_dtype)?;
        let weights = match source {
            WeightSource::Model(m) => GpuWeights::upload(&dev, m)?,
            WeightSource::Random(seed) => {
                GpuWeights::random(&dev, &kv_kernels, &layer_kernels, &config, seed)?
            }
        };
        let rope_table = |cpu: Rope| -> Result<RopeTable, CudaError> {
            Ok(RopeTable {
                inv_freq: dev
                    .stream
                    .clone_htod(cpu.inv_freq())
                    .map_err(driver("cuMemcpyHtoD"))?,
                halves: cpu.style() == RopeStyle::Halves,
            })
        };
        let rope = rope_table(Rope::new(&config))?;
        let rope_local = Rope::local(&config).map(rope_table).transpose()?;
        let sparse_attn = Selection::new(StepAttention::new(&dev, geom, kv_dtype, config.heads_q)?);
        let window_attn = config
            .gemma
            .map(|_| StepAttention::with_first_skips(&dev, geom, kv_dtype, config.heads_q))
            .transpose()?;
        let mut model = Self {
            blas: Blas::new(&dev)?,
            prefill: PrefillAttention::new(&dev, geom, kv_dtype, config.heads_q)?,
            dense_attn: StepAttention::new(&dev, geom, kv_dtype, config.heads_q)?,
            window_attn,
            window_table: None,
            scratch: Scratch::default(),
            allocator: PageAllocator::new(0),
            layer_kernels,
            sampling: SamplingKernels::new(&dev)?,
            kv_kernels,
            rope,
            rope_local,
            kv: Vec::new(),
            flow: GpuFlow::Dense,
            others: Vec::new(),
            weights,
            geom,
            kv_dtype,
            config,
            dev,
            logit_rows: 0,
            pass_rows: 0,
            host_logits: None,
            logprobs: None,
            logprobs_in_flight: Default::default(),
            prompt_scores: Default::default(),
            profiler: None,
            use_graphs: true,
            graphs_captured: 0,
            graphs: Vec::new(),
            capture: CapturePolicy::default(),
            generation: 0,
            dense_table: None,
            selections: vec![sparse_attn],
            active_selections: 0,
            ahead: Ahead::default(),
            recall: recall::RecallProbe::default(),
            keep_free: None,
        };
        model.reset(num_pages, flow)?;
        Ok(model)
    }

    /// Stores the weight matrices as fp8 (e4m3) with a scale a row from now on: half the bytes
    /// a decode step reads. Call it before sizing the pool: the bf16 copies are freed.
    pub fn use_fp8_weights(&mut self) -> Result<(), CudaError> {
        self.graphs.clear();
        let fp8 = self.blas.fp8(&self.dev)?;
        self.weights.quantize_fp8(&self.dev, fp8)?;
        self.dev.synchronize()
    }

    /// Allocates the working memory of a pass of `rows` tokens over `seqs` sequences now, so
    /// that a server learns at start whether its largest step fits beside the KV pool.
    pub fn reserve_steps(&mut self, rows: usize, seqs: usize) -> Result<(), CudaError> {
        self.scratch
            .reserve(&self.dev, &self.config, rows.max(1), seqs.max(1))
    }

    /// Replaces the pool by `num_pages` empty pages per layer and the flow by `flow` (the old
    /// ones are freed first; the other flows are made anew for the new pool); sequences of the
    /// old pool are void.
    pub fn reset(&mut self, num_pages: usize, flow: &Flow) -> Result<(), CudaError> {
        GpuLayerKv::check_pages(num_pages)?;
        self.graphs.clear();
        self.ahead = Ahead::default();
        self.dense_table = None;
        self.window_table = None;
        self.selections.truncate(1);
        self.selections[0].table = None;
        self.active_selections = 0;
        self.kv.clear();
        self.flow = GpuFlow::Dense;
        let others: Vec<Flow> = self.others.drain(..).map(|o| o.def).collect();
        // Until every layer is in place the model holds no pages, so that a failure part way
        // leaves no allocator promising pages the layers lack.
        self.allocator = PageAllocator::new(0);
        for _ in 0..self.config.layers {
            let layer = GpuLayerKv::new(&self.dev, self.geom, num_pages, self.kv_dtype)
                .inspect_err(|_| self.kv.clear())?;
            self.kv.push(layer);
        }
        self.allocator = PageAllocator::new(num_pages);
        self.set_flow(flow, &[])?;
        // Their summaries count in each page of the new pool (`page_bytes`).
        for def in &others {
            self.push_flow(def, &[], false)?;
        }
        Ok(())
    }

    /// Shortens `seq` to its first `len` tokens, freeing the pages past them. A flow's state
    /// slot keeps what it held for the dropped pages: a truncated sequence that goes on
    /// decoding takes a fresh slot, as the engine does for a preempted request.
    pub fn truncate(&mut self, seq: &mut Sequence, len: usize) {
        let keep = self.geom.pages_for(len.min(seq.len));
        for p in seq.pages.drain(keep..) {
            self.allocator.release(p);
        }
        seq.len = len.min(seq.len);
    }

    /// Bytes of one layer's K and V pool.
    pub fn kv_bytes_per_layer(geom: KvGeometry, num_pages: usize, dtype: PoolDtype) -> usize {
        // Saturating: a pool too large to count is too large to allocate.
        num_pages
            .saturating_mul(2 * geom.page_elems())
            .saturating_mul(dtype.size())
    }

    /// Frees a sequence's pages.
    pub fn free(&mut self, seq: &mut Sequence) {
        for &p in &seq.pages {
            self.allocator.release(p);
        }
        *seq = Sequence::default();
    }

    /// Gives each of `seqs` (empty) a context of `tokens` tokens whose keys and values are
    /// random (uniform in [-1, 1)), summarised by the flow's cache phase: a long context for
    /// measuring decode steps without prefilling it.
    pub fn fill_random_context(
        &mut self,
        seqs: &mut [Sequence],
        tokens: usize,
        seed: u64,
    ) -> Result<(), CudaError> {
        // The fill writes every page of the pool, so no other sequence may hold one.
        if self.allocator.free_count() != self.allocator.total() || seqs.iter().any(|s| s.len > 0) {
            return Err(CudaError::Invalid(
                "a random context fills the whole pool: give it empty sequences of an empty pool"
                    .into(),
            ));
        }
        let per_seq = self.geom.pages_for(tokens);
        if per_seq * seqs.len() > self.allocator.free_count() || tokens > self.config.max_positions
        {
            return Err(CudaError::Invalid(format!(
                "{} sequences of {tokens} tokens do not fit the pool or the context",
                seqs.len()
            )));
        }
        let mut complete = Vec::new();
        for s in seqs.iter_mut() {
            for _ in 0..per_seq {
                let p = self
                    .allocator
                    .allocate()
                    .map_err(|e| CudaError::Invalid(e.to_string()))?;
                s.pages.push(p);
            }
            s.len = tokens;
            complete.extend_from_slice(&s.pages[..s.complete_pages(self.geom.page_size)]);
        }
        let complete = PageList::new(&self.dev, &complete)?;
        for (l, layer) in self.kv.iter_mut().enumerate() {
            self.kv_kernels
                .fill_uniform(&self.dev, layer, seed.wrapping_add(l as u64))?;
            let others = self.others.iter_mut().map(|o| &mut o.gpu);
            for flow in std::iter::once(&mut self.flow).chain(others) {
                flow.summarize(&self.dev, &self.kv_kernels, l, layer, &complete)?;
            }
        }
        Ok(())
    }

    /// Copies page `src`'s keys and values to page `dst` in every layer (copy-on-write of a
    /// shared page by the caller's allocator).
    pub fn copy_page(&mut self, src: u32, dst: u32) -> Result<(), CudaError> {
        let e = self.geom.page_elems() * self.kv_dtype.size();
        let (s, d) = (src as usize * e, dst as usize * e);
        let n = self.allocator.total();
        if src as usize >= n || dst as usize >= n || src == dst {
            return Err(CudaError::Invalid(format!("copy page {src} to {dst}")));
        }
        let stream = self.dev.stream.clone();
        for layer in &mut self.kv {
            for buf in [&mut layer.k, &mut layer.v] {
                let from = buf.slice(s..s + e);
                // The pool holds both pages; copy through a temporary to keep the borrows apart.
                let tmp = stream.clone_dtod(&from).map_err(driver("cuMemcpyDtoD"))?;
                stream
                    .memcpy_dtod(&tmp, &mut buf.slice_mut(d..d + e))
                    .map_err(driver("cuMemcpyDtoD"))?;
            }
        }
        Ok(())
    }
}
