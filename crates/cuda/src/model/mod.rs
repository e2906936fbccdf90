//! A decoder model on the GPU: weights, the paged KV pool of every layer, and the forward pass
//! (chunked prefill with causal attention, decode steps with the flow's sparse attention).

mod ahead;
mod flow;
mod forward;
mod graphs;
mod logprobs;
mod memory;
mod profile;
mod prompt_scores;
mod recall;
mod scratch;
mod selection;
mod serve;
mod weights;
mod window;

pub use flow::{GenFlow, GpuFlow, IndexedFlow};
pub use memory::RUNNING_HEADROOM;
pub use profile::{Profiler, STAGES, Stage};
pub use recall::StepRecall;
pub use serve::CudaPass;
pub use weights::{GpuLayer, GpuWeights};

use cudarc::driver::{DeviceRepr, PinnedHostSlice, ValidAsZeroBits};
use rayon::prelude::*;
use vortex_flow::Flow;
use vortex_flow::state::StateSlot;
use vortex_kv::{KvGeometry, PageAllocator, Sequence};
use vortex_model::config::{ModelConfig, RopeStyle};
use vortex_model::layers::Rope;
use vortex_model::sampling::DeviceDraw;

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

/// A flow loaded beside the model's own, for the sequences that choose it: its definition (to
/// rebuild it with a new pool) and its kernels and summaries.
pub struct OtherFlow {
    pub def: Flow,
    pub gpu: GpuFlow,
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

    /// Loads `flow` beside the others for the sequences that choose it, its cache phase run over
    /// the complete pages of `seqs` (every sequence that may decode with it); returns its index
    /// for [`PlacedStep::flow`]. Its summaries of every page of the pool take device memory:
    /// [`fill_memory`](Self::fill_memory) can leave room for them.
    pub fn add_flow(&mut self, flow: &Flow, seqs: &[&Sequence]) -> Result<usize, CudaError> {
        let room_left = match &mut self.keep_free {
            Some((_, room)) => room
                .iter()
                .position(|n| *n == flow.name)
                .map(|i| room.remove(i))
                .is_some(),
            None => true,
        };
        self.push_flow(flow, seqs, !room_left)
    }

    /// [`add_flow`](Self::add_flow); with `check_memory`, refused where its summaries would
    /// leave less device memory free than [`fill_memory`](Self::fill_memory) keeps.
    fn push_flow(
        &mut self,
        flow: &Flow,
        seqs: &[&Sequence],
        check_memory: bool,
    ) -> Result<usize, CudaError> {
        let mut gpu = self.new_flow(flow, self.allocator.total())?;
        // A flow without summaries (dense) takes nothing from the pool's share.
        let takes = gpu.summary_bytes() > 0;
        if let Some((keep, _)) = self.keep_free.as_ref().filter(|_| check_memory && takes) {
            let (free, _) = self.memory()?;
            if free < *keep {
                return Err(CudaError::Invalid(format!(
                    "its summaries would leave {} MiB of device memory free, under the {} MiB \
                     the memory share and the running headroom keep",
                    free >> 20,
                    keep >> 20
                )));
            }
        }
        self.summarize_all(&mut gpu, seqs)?;
        self.graphs.clear();
        self.generation += 1;
        self.others.push(OtherFlow {
            def: flow.clone(),
            gpu,
        });
        Ok(self.others.len())
    }

    /// `flow`'s kernels, with summaries for a pool of `num_pages` pages.
    fn new_flow(&self, flow: &Flow, num_pages: usize) -> Result<GpuFlow, CudaError> {
        let selecting: Vec<bool> = (0..self.config.layers)
            .map(|l| self.config.window(l).is_none())
            .collect();
        GpuFlow::new(
            &self.dev,
            flow,
            self.geom,
            self.kv_dtype,
            &selecting,
            num_pages,
            self.geom.pages_for(self.config.max_positions),
        )
    }

    /// The device's free and total memory, once what was freed has returned to it.
    fn memory(&self) -> Result<(usize, usize), CudaError> {
        // Freed memory returns to the device at a synchronisation.
        self.dev.synchronize()?;
        self.dev.ctx.mem_get_info().map_err(driver("cuMemGetInfo"))
    }

    /// The flow of index `i` (0 the model's own, then [`add_flow`](Self::add_flow)'s).
    pub fn flow_at(&self, i: usize) -> Option<&GpuFlow> {
        flow_in(&self.flow, &self.others, i)
    }

    /// Loaded flows, the model's own first.
    pub fn num_flows(&self) -> usize {
        1 + self.others.len()
    }

    /// Runs `flow`'s cache phase over the complete pages of `seqs`, every layer that keeps
    /// summaries.
    fn summarize_all(&self, flow: &mut GpuFlow, seqs: &[&Sequence]) -> Result<(), CudaError> {
        let page = self.geom.page_size;
        let mut complete: Vec<u32> = Vec::new();
        for s in seqs {
            let pages = s.pages.get(..s.complete_pages(page)).ok_or_else(|| {
                CudaError::Invalid("a sequence has fewer pages than its tokens need".into())
            })?;
            complete.extend_from_slice(pages);
        }
        if !complete.is_empty() {
            let complete = PageList::new(&self.dev, &complete)?;
            for (l, kv) in self.kv.iter().enumerate() {
                flow.summarize(&self.dev, &self.kv_kernels, l, kv, &complete)?;
            }
        }
        Ok(())
    }

    /// Decodes with `flow` from now on, its cache phase run over the complete pages of `seqs`.
    pub fn set_flow(&mut self, flow: &Flow, seqs: &[&Sequence]) -> Result<(), CudaError> {
        self.graphs.clear();
        self.generation += 1;
        self.flow = GpuFlow::Dense;
        let mut gpu = self.new_flow(flow, self.allocator.total())?;
        self.summarize_all(&mut gpu, seqs)?;
        self.flow = gpu;
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

    /// A zeroed state slot for a new request when the flow keeps per-request state (`h2o`),
    /// `None` otherwise. The slot is free again once its handle and every clone of it drop.
    pub fn state_slot(&mut self) -> Result<Option<StateSlot>, CudaError> {
        self.state_slot_for(0)
    }

    /// [`state_slot`](Self::state_slot) for a sequence that decodes with flow `i`.
    pub fn state_slot_for(&mut self, i: usize) -> Result<Option<StateSlot>, CudaError> {
        let flow = match i {
            0 => &mut self.flow,
            i => &mut self.others.get_mut(i - 1).ok_or_else(|| no_flow(i))?.gpu,
        };
        flow.state_slot(&self.dev)
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

    fn check_ran(&self) -> Result<(), CudaError> {
        if self.logit_rows == 0 {
            return Err(CudaError::Invalid("no forward pass has run yet".into()));
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

    /// The last forward pass's logits, one row per sequence.
    pub fn logits(&mut self) -> Result<Vec<Vec<f32>>, CudaError> {
        let rows: Vec<usize> = (0..self.logit_rows).collect();
        self.logits_of(&rows)
    }

    /// The logits of the last forward pass's sequences `rows` (indices into its batch): the
    /// span they lie in is copied at once into page-locked memory, then out to a vector a row.
    pub fn logits_of(&mut self, rows: &[usize]) -> Result<Vec<Vec<f32>>, CudaError> {
        self.check_ran()?;
        let v = self.config.vocab;
        if let Some(&r) = rows.iter().find(|&&r| r >= self.logit_rows) {
            return Err(CudaError::Invalid(format!(
                "row {r} of a pass of {} sequences",
                self.logit_rows
            )));
        }
        let (Some(&lo), Some(&hi)) = (rows.iter().min(), rows.iter().max()) else {
            return Ok(Vec::new());
        };
        let span = (hi + 1 - lo) * v;
        let dst = host_prefix(&self.dev, &mut self.host_logits, span)?;
        self.dev
            .stream
            .memcpy_dtoh(&self.scratch.logits.slice(lo * v..(hi + 1) * v), dst)
            .map_err(driver("cuMemcpyDtoH"))?;
        // The copy into page-locked memory is asynchronous, and this context does not track
        // events on host buffers: wait for the stream before reading.
        self.dev.synchronize()?;
        let host = self.host_logits.as_ref().expect("filled above");
        let all = host.as_slice().map_err(driver("cuEventSynchronize"))?;
        Ok(rows
            .par_iter()
            .map(|&r| all[(r - lo) * v..(r - lo + 1) * v].to_vec())
            .collect())
    }

    /// Tokens of the last forward pass's sequences chosen on the device, one for each
    /// `(row, draw)`: the argmax of the row's logits at temperature 0, else a draw from their
    /// softmax at that temperature over the tokens the draw's cuts keep (the Gumbel-max trick,
    /// noise hashed from the seed and the token id). Only the ids are copied back.
    pub fn draw(&mut self, picks: &[(usize, DeviceDraw)]) -> Result<Vec<u32>, CudaError> {
        self.queue_draw(picks)?;
        if picks.is_empty() {
            return Ok(Vec::new());
        }
        self.dev
            .stream
            .clone_dtoh(&self.scratch.next.slice(..picks.len()))
            .map_err(driver("cuMemcpyDtoH"))
    }

    /// Holds rows of the last forward pass's logits to token sets before a
    /// [`draw`](Self::draw): for each `(row, set)`, the logits of tokens outside the set (bit
    /// `id % 64` of word `id / 64`) become -inf.
    pub fn mask_rows(&mut self, masks: &[(usize, &[u64])]) -> Result<(), CudaError> {
        self.check_ran()?;
        if masks.is_empty() {
            return Ok(());
        }
        if let Some((r, _)) = masks.iter().find(|m| m.0 >= self.logit_rows) {
            return Err(CudaError::Invalid(format!(
                "mask of row {r}: a pass of {} sequences",
                self.logit_rows
            )));
        }
        let sc = &mut self.scratch;
        sc.masks.load(&self.dev, self.config.vocab, masks)?;
        self.sampling.mask(
            &self.dev,
            &mut sc.logits,
            self.logit_rows,
            self.config.vocab,
            &sc.masks,
        )
    }

    /// Queues [`draw`](Self::draw)'s tokens into `scratch.next`, one a pick in order.
    fn queue_draw(&mut self, picks: &[(usize, DeviceDraw)]) -> Result<(), CudaError> {
        self.check_ran()?;
        if let Some((r, _)) = picks.iter().find(|p| p.0 >= self.logit_rows) {
            return Err(CudaError::Invalid(format!(
                "draw from row {r}: a pass of {} sequences",
                self.logit_rows
            )));
        }
        let sc = &mut self.scratch;
        sc.draws.load(&self.dev, picks)?;
        // A draw may pick more tokens than the pass has rows (several seeds from one row).
        sc.next.ensure(&self.dev, picks.len(), false)?;
        self.sampling.draw(
            &self.dev,
            &sc.logits,
            self.logit_rows,
            self.config.vocab,
            &sc.draws,
            &mut sc.next,
        )
    }

    /// The most likely next token of each sequence of the last forward pass, chosen on the
    /// device (only the token ids are copied back).
    pub fn argmax(&mut self) -> Result<Vec<u32>, CudaError> {
        let rows = self.queue_argmax()?;
        self.dev
            .stream
            .clone_dtoh(&self.scratch.next.slice(..rows))
            .map_err(driver("cuMemcpyDtoH"))
    }

    /// Queues the argmax of each row of the last pass's logits into `scratch.next`; returns
    /// the rows.
    fn queue_argmax(&mut self) -> Result<usize, CudaError> {
        self.check_ran()?;
        let sc = &mut self.scratch;
        self.sampling.argmax(
            &self.dev,
            &sc.logits,
            self.logit_rows,
            self.config.vocab,
            &mut sc.next,
        )?;
        Ok(self.logit_rows)
    }
}

/// The flow of index `i` among the model's own (0) and the others.
fn flow_in<'a>(own: &'a GpuFlow, others: &'a [OtherFlow], i: usize) -> Option<&'a GpuFlow> {
    match i {
        0 => Some(own),
        i => others.get(i - 1).map(|o| &o.gpu),
    }
}

fn no_flow(i: usize) -> CudaError {
    CudaError::Invalid(format!("no flow {i} is loaded on this GPU model"))
}

/// The first `n` values of the page-locked buffer in `slot`, reallocated where it holds fewer,
/// as a device-to-host copy's destination: such a copy fills its whole destination, so it gets
/// exactly `n` values, not the buffer's largest size so far.
fn host_prefix<'a, T: DeviceRepr + ValidAsZeroBits>(
    dev: &Device,
    slot: &'a mut Option<PinnedHostSlice<T>>,
    n: usize,
) -> Result<&'a mut [T], CudaError> {
    if slot.as_ref().is_none_or(|h| h.len() < n) {
        *slot = None;
        // SAFETY: the caller's copy writes the values before anything reads them; flags 0
        // keep the memory cached for the host's reads (write-combined memory reads slowly).
        let h = unsafe { dev.ctx.alloc_pinned_with_flags::<T>(n, 0) }
            .map_err(driver("cuMemHostAlloc"))?;
        *slot = Some(h);
    }
    let host = slot.as_mut().expect("allocated above");
    Ok(&mut host.as_mut_slice().map_err(driver("cuEventSynchronize"))?[..n])
}
