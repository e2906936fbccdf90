//! A decoder model on the GPU: weights, the paged KV pool of every layer, and the forward pass
//! (chunked prefill with causal attention, decode steps with the flow's sparse attention).

mod flow;
mod profile;
mod scratch;
mod weights;

pub use flow::{GenFlow, GpuFlow, IndexedFlow};
pub use profile::{Profiler, STAGES, Stage};
pub use weights::{GpuLayer, GpuWeights};

use cudarc::driver::CudaSlice;
use vortex_flow::{Flow, Settings};
use vortex_kv::{KvGeometry, PageAllocator, PageTable, Sequence};
use vortex_model::config::{ModelConfig, RopeStyle};
use vortex_model::layers::Rope;

use crate::attention::Variant;
use crate::blas::Blas;
use crate::block_topk::{SelRow, sel_rows};
use crate::error::driver;
use crate::layer_kernels::{LayerKernels, QkvExtras, RopeTable};
use crate::prefill::{PrefillAttention, PrefillSeq, tiles};
use crate::{CudaError, DecodeAttention, Device, DeviceTable, GpuLayerKv, KvKernels};
use scratch::Scratch;

/// One sequence's part of a forward pass: the tokens to append to it.
pub struct GpuStep<'a> {
    pub seq: &'a mut Sequence,
    pub tokens: &'a [u32],
}

pub struct GpuModel {
    pub dev: Device,
    pub config: ModelConfig,
    pub weights: GpuWeights,
    pub kv: Vec<GpuLayerKv>,
    pub allocator: PageAllocator,
    pub flow: GpuFlow,
    pub geom: KvGeometry,
    blas: Blas,
    layer_kernels: LayerKernels,
    kv_kernels: KvKernels,
    rope: RopeTable,
    prefill: PrefillAttention,
    dense_attn: DecodeAttention,
    sparse_attn: DecodeAttention,
    scratch: Scratch,
    /// Rows of the last forward pass's logits.
    logit_rows: usize,
    /// When set, forward passes record their stages' device time here.
    pub profiler: Option<Profiler>,
}

/// What a forward pass adds, in batch order.
struct StepRows<'a> {
    n: usize,
    decode_only: bool,
    /// Pages that the new tokens completed (the cache phase summarises them).
    completed: &'a [u32],
    /// Each sequence's length after the pass.
    seq_tokens: &'a [usize],
    prefill: &'a [PrefillSeq],
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
    /// decoding with `flow` (checked for this model's geometry).
    pub fn new(
        dev: Device,
        config: ModelConfig,
        source: WeightSource,
        page_size: usize,
        num_pages: usize,
        flow: &Flow,
    ) -> Result<Self, CudaError> {
        let geom = KvGeometry::new(config.heads_kv, config.head_dim, page_size)
            .map_err(|e| CudaError::Invalid(e.to_string()))?;
        let layer_kernels = LayerKernels::new(&dev, config.head_dim, page_size)?;
        let kv_kernels = KvKernels::new(&dev, geom)?;
        let weights = match source {
            WeightSource::Model(m) => GpuWeights::upload(&dev, m)?,
            WeightSource::Random(seed) => {
                GpuWeights::random(&dev, &kv_kernels, &layer_kernels, &config, seed)?
            }
        };
        let cpu_rope = Rope::new(&config);
        let rope = RopeTable {
            inv_freq: dev
                .stream
                .clone_htod(cpu_rope.inv_freq())
                .map_err(driver("cuMemcpyHtoD"))?,
            halves: cpu_rope.style() == RopeStyle::Halves,
        };
        let mut model = Self {
            blas: Blas::new(&dev)?,
            prefill: PrefillAttention::new(&dev, geom, config.heads_q)?,
            dense_attn: DecodeAttention::new(&dev, geom, config.heads_q, Variant::default())?,
            sparse_attn: DecodeAttention::new(&dev, geom, config.heads_q, Variant::default())?,
            scratch: Scratch::default(),
            allocator: PageAllocator::new(0),
            layer_kernels,
            kv_kernels,
            rope,
            kv: Vec::new(),
            flow: GpuFlow::Dense,
            weights,
            geom,
            config,
            dev,
            logit_rows: 0,
            profiler: None,
        };
        model.reset(num_pages, flow)?;
        Ok(model)
    }

    /// Replaces the pool by `num_pages` empty pages per layer and the flow by `flow` (the old
    /// ones are freed first); sequences of the old pool are void.
    pub fn reset(&mut self, num_pages: usize, flow: &Flow) -> Result<(), CudaError> {
        self.kv.clear();
        self.flow = GpuFlow::Dense;
        for _ in 0..self.config.layers {
            self.kv
                .push(GpuLayerKv::new(&self.dev, self.geom, num_pages)?);
        }
        self.allocator = PageAllocator::new(num_pages);
        self.set_flow(flow, &[])
    }

    /// Decodes with `flow` from now on, its cache phase run over the complete pages of `seqs`.
    pub fn set_flow(&mut self, flow: &Flow, seqs: &[&Sequence]) -> Result<(), CudaError> {
        self.flow = GpuFlow::Dense;
        self.flow = GpuFlow::new(
            &self.dev,
            flow,
            self.geom,
            self.config.layers,
            self.allocator.total(),
        )?;
        let page = self.geom.page_size;
        let complete: Vec<u32> = seqs
            .iter()
            .flat_map(|s| s.pages[..s.complete_pages(page)].iter().copied())
            .collect();
        if !complete.is_empty() {
            for (l, kv) in self.kv.iter().enumerate() {
                self.flow
                    .summarize(&self.dev, &self.kv_kernels, l, kv, &complete)?;
            }
        }
        Ok(())
    }

    /// Shortens `seq` to its first `len` tokens, freeing the pages past them.
    pub fn truncate(&mut self, seq: &mut Sequence, len: usize) {
        let keep = self.geom.pages_for(len.min(seq.len));
        for p in seq.pages.drain(keep..) {
            self.allocator.release(p);
        }
        seq.len = len.min(seq.len);
    }

    /// Bytes of one layer's K and V pool.
    pub fn kv_bytes_per_layer(geom: KvGeometry, num_pages: usize) -> usize {
        2 * num_pages * geom.page_elems() * 2
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
        for (l, layer) in self.kv.iter_mut().enumerate() {
            self.kv_kernels
                .fill_uniform(&self.dev, layer, seed.wrapping_add(l as u64))?;
            self.flow
                .summarize(&self.dev, &self.kv_kernels, l, layer, &complete)?;
        }
        Ok(())
    }

    /// Appends each step's tokens to its sequence and runs every layer; the logits of each
    /// sequence's last new token are left on the device (see [`logits`](Self::logits) and
    /// [`argmax`](Self::argmax)). A pass where every sequence adds one token decodes with the
    /// flow's attention; any other runs dense causal attention for all its rows.
    pub fn forward(&mut self, batch: &mut [GpuStep]) -> Result<(), CudaError> {
        let cfg = &self.config;
        let page = self.geom.page_size;
        for s in batch.iter() {
            if s.tokens.is_empty() {
                return Err(CudaError::Invalid(
                    "a sequence in the batch has no new token".into(),
                ));
            }
            if let Some(&t) = s.tokens.iter().find(|&&t| t as usize >= cfg.vocab) {
                return Err(CudaError::Invalid(format!(
                    "token id {t} is outside the vocabulary of {}",
                    cfg.vocab
                )));
            }
            if s.seq.len + s.tokens.len() > cfg.max_positions {
                return Err(CudaError::Invalid(format!(
                    "{} tokens exceed the model's context of {}",
                    s.seq.len + s.tokens.len(),
                    cfg.max_positions
                )));
            }
        }
        let needed: usize = batch
            .iter()
            .map(|s| self.geom.pages_for(s.seq.len + s.tokens.len()) - s.seq.pages.len())
            .sum();
        if needed > self.allocator.free_count() {
            return Err(CudaError::Invalid(format!(
                "KV pool full: {needed} pages needed, {} free",
                self.allocator.free_count()
            )));
        }
        // Rows: token ids, positions and (page, slot) of every new token, in batch order.
        let (mut tokens, mut pos, mut slots, mut completed) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut last_rows = Vec::with_capacity(batch.len());
        let mut prefill_seqs = Vec::new();
        for (b, s) in batch.iter_mut().enumerate() {
            prefill_seqs.push(PrefillSeq {
                first_row: tokens.len(),
                tokens: s.tokens.len(),
                start: s.seq.len,
                table_row: b,
            });
            for &t in s.tokens {
                if s.seq.len.is_multiple_of(page) {
                    let p = self
                        .allocator
                        .allocate()
                        .map_err(|e| CudaError::Invalid(format!("KV pool: {e} (checked above)")))?;
                    s.seq.pages.push(p);
                }
                let p = *s.seq.pages.last().expect("a page was just ensured");
                tokens.push(t);
                pos.push(s.seq.len as i32);
                slots.extend([p, (s.seq.len % page) as u32]);
                s.seq.len += 1;
                if s.seq.len.is_multiple_of(page) {
                    completed.push(p);
                }
            }
            last_rows.push((tokens.len() - 1) as i32);
        }
        let decode_only = batch.iter().all(|s| s.tokens.len() == 1);
        let seqs: Vec<&Sequence> = batch.iter().map(|s| &*s.seq).collect();
        let dense = DeviceTable::upload(
            &self.dev,
            &PageTable::dense(&seqs, page),
            self.geom.kv_heads,
            page,
            self.allocator.total(),
        )?;
        let seq_tokens: Vec<usize> = seqs.iter().map(|s| s.len).collect();
        let n = tokens.len();
        self.scratch.prepare(
            &self.dev,
            cfg,
            n,
            batch.len(),
            &tokens,
            &pos,
            &slots,
            &last_rows,
        )?;
        if decode_only {
            let plan = self.dense_attn.plan(&dense);
            self.dense_attn.load_plan(&self.dev, &plan)?;
        } else {
            let t: Vec<i32> = tiles(&prefill_seqs).concat();
            self.scratch.load_tiles(&self.dev, &t)?;
        }
        let step = StepRows {
            n,
            decode_only,
            completed: &completed,
            seq_tokens: &seq_tokens,
            prefill: &prefill_seqs,
        };
        self.run_layers(&dense, &step)?;
        self.finish(batch.len())
    }

    fn run_layers(&mut self, dense: &DeviceTable, step: &StepRows) -> Result<(), CudaError> {
        let StepRows {
            n,
            decode_only,
            completed,
            seq_tokens,
            prefill,
        } = *step;
        let cfg = &self.config;
        let (hq, d) = (cfg.heads_q, cfg.head_dim);
        let scale = 1.0 / (d as f32).sqrt();
        let dev = &self.dev;
        let sc = &mut self.scratch;
        let mut sparse: Option<(Vec<SelRow>, DeviceTable)> = None;
        macro_rules! mark {
            ($stage:expr) => {
                if let Some(p) = self.profiler.as_mut() {
                    p.mark(dev, $stage)?;
                }
            };
        }
        mark!(Stage::Start);
        self.layer_kernels.embed(
            dev,
            &self.weights.embed.data,
            &sc.tokens,
            n,
            cfg.hidden,
            &mut sc.x,
        )?;
        for (l, lw) in self.weights.layers.iter().enumerate() {
            let kv = &mut self.kv[l];
            self.layer_kernels.rms_norm(
                dev,
                &sc.x,
                None,
                n,
                &lw.attn_norm,
                cfg.rms_eps,
                &mut sc.h,
            )?;
            mark!(Stage::Elementwise);
            self.blas
                .matmul(dev, &sc.h, n, &lw.qkv, &mut sc.qkv, false)?;
            mark!(Stage::Matmul);
            let extras = QkvExtras {
                bias: lw.bias.as_ref(),
                q_norm: lw.q_norm.as_ref(),
                k_norm: lw.k_norm.as_ref(),
                eps: cfg.rms_eps,
            };
            self.layer_kernels.qkv_post(
                dev, &sc.qkv, n, hq, &extras, &self.rope, &sc.pos, &sc.slots, &mut sc.q, kv,
            )?;
            mark!(Stage::Elementwise);
            if !completed.is_empty() {
                self.flow
                    .summarize(dev, &self.kv_kernels, l, kv, completed)?;
                mark!(Stage::Cache);
            }
            if !decode_only {
                self.prefill.run(
                    dev,
                    kv,
                    dense,
                    prefill,
                    &sc.tiles,
                    &sc.q,
                    scale,
                    &mut sc.attn,
                )?;
            } else if let Some(settings) = self.flow.settings().cloned() {
                let settings: Vec<&Settings> = vec![&settings; dense.batch];
                let (rows, _) = sel_rows(
                    &dense.row_pages,
                    &settings,
                    l,
                    seq_tokens,
                    self.geom.kv_heads,
                );
                if sparse.as_ref().is_none_or(|(r, _)| *r != rows) {
                    let table = self.flow.prepare(dev, dense, &rows)?;
                    let plan = self.sparse_attn.plan(&table);
                    self.sparse_attn.load_plan(dev, &plan)?;
                    sparse = Some((rows, table));
                }
                let (rows, table) = sparse.as_mut().expect("prepared above");
                self.flow
                    .select(dev, l, dense, kv.num_pages, &sc.q, rows, table)?;
                mark!(Stage::Index);
                self.sparse_attn
                    .launch(dev, kv, table, &sc.q, scale, &mut sc.attn)?;
            } else {
                self.dense_attn
                    .launch(dev, kv, dense, &sc.q, scale, &mut sc.attn)?;
            }
            mark!(Stage::Attention);
            self.layer_kernels
                .to_bf16(dev, &sc.attn, n * hq * d, &mut sc.attn_bf16)?;
            mark!(Stage::Elementwise);
            self.blas
                .matmul(dev, &sc.attn_bf16, n, &lw.wo, &mut sc.x, true)?;
            mark!(Stage::Matmul);
            self.layer_kernels.rms_norm(
                dev,
                &sc.x,
                None,
                n,
                &lw.ffn_norm,
                cfg.rms_eps,
                &mut sc.h,
            )?;
            mark!(Stage::Elementwise);
            self.blas
                .matmul(dev, &sc.h, n, &lw.gate_up, &mut sc.gu, false)?;
            mark!(Stage::Matmul);
            self.layer_kernels
                .silu_mul(dev, &sc.gu, n, cfg.ffn, &mut sc.act)?;
            mark!(Stage::Elementwise);
            self.blas
                .matmul(dev, &sc.act, n, &lw.down, &mut sc.x, true)?;
            mark!(Stage::Matmul);
        }
        Ok(())
    }

    /// The final norm of each sequence's last row and the output projection.
    fn finish(&mut self, seqs: usize) -> Result<(), CudaError> {
        let cfg = &self.config;
        let sc = &mut self.scratch;
        self.layer_kernels.rms_norm(
            &self.dev,
            &sc.x,
            Some(&sc.last_rows),
            seqs,
            &self.weights.norm,
            cfg.rms_eps,
            &mut sc.last,
        )?;
        self.blas.matmul(
            &self.dev,
            &sc.last,
            seqs,
            self.weights.head(),
            &mut sc.logits,
            false,
        )?;
        self.logit_rows = seqs;
        Ok(())
    }

    /// The last forward pass's logits, one row per sequence.
    pub fn logits(&self) -> Result<Vec<Vec<f32>>, CudaError> {
        let v = self.config.vocab;
        let all = self
            .dev
            .stream
            .clone_dtoh(&self.scratch.logits.slice(..self.logit_rows * v))
            .map_err(driver("cuMemcpyDtoH"))?;
        Ok(all.chunks(v).map(<[f32]>::to_vec).collect())
    }

    /// The most likely next token of each sequence of the last forward pass, chosen on the
    /// device (only the token ids are copied back).
    pub fn argmax(&mut self) -> Result<Vec<u32>, CudaError> {
        let sc = &mut self.scratch;
        self.layer_kernels.argmax(
            &self.dev,
            &sc.logits,
            self.logit_rows,
            self.config.vocab,
            &mut sc.next,
        )?;
        self.dev
            .stream
            .clone_dtoh(&sc.next.slice(..self.logit_rows))
            .map_err(driver("cuMemcpyDtoH"))
    }

    /// The logits buffer (for callers that keep sampling on the device).
    pub fn logits_buffer(&self) -> &CudaSlice<f32> {
        &self.scratch.logits
    }
}
