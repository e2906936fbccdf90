//! The decoder forward pass over a ragged batch: chunked prefill with dense causal attention and
//! decode steps with the flow's sparse attention, on the paged KV cache.

use rayon::prelude::*;
use vortex_flow::Settings;
use vortex_flow::runner::StepSeq;
use vortex_flow::state::RequestState;
use vortex_kernels::attention::decode_attention;
use vortex_kernels::prefill::prefill_attention_with;
use vortex_kernels::simd::Simd;
use vortex_kv::{LayerKv, PageId, PageTable, Sequence};

use crate::config::ModelConfig;
pub use crate::forward_pass::{CpuPass, ForwardPass, Next, PromptRows, Scored, Wants};
pub use crate::kv_state::{FlowSlot, KvState};
use crate::layers::{Rope, gelu_mul, head_norm, rms_norm, silu_mul};
use crate::logprob::{TokenLogprob, token_logprob};
use crate::weights::Weight;

/// One decoder layer's weights.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: Weight,
    pub wk: Weight,
    pub wv: Weight,
    pub wo: Weight,
    pub bias: Option<[Vec<f32>; 3]>,
    pub qk_norm: Option<[Vec<f32>; 2]>,
    pub ffn_norm: Vec<f32>,
    /// Norms of the attention's and the FFN's outputs before they join the residual (Gemma 3).
    pub post_norms: Option<[Vec<f32>; 2]>,
    pub gate: Weight,
    pub up: Weight,
    pub down: Weight,
}

impl LayerWeights {
    /// This layer with each of its seven matrices replaced by `f` of it (norms and biases as
    /// they are).
    pub fn map_matrices(&self, f: impl Fn(&Weight) -> Weight) -> Self {
        let mut l = self.clone();
        for w in [
            &mut l.wq,
            &mut l.wk,
            &mut l.wv,
            &mut l.wo,
            &mut l.gate,
            &mut l.up,
            &mut l.down,
        ] {
            *w = f(w);
        }
        l
    }
}

/// A loaded model: configuration and weights.
#[derive(Debug, Clone)]
pub struct Model {
    pub config: ModelConfig,
    pub embed: Weight,
    pub layers: Vec<LayerWeights>,
    pub norm: Vec<f32>,
    /// `None` when the output projection is the (tied) embedding.
    pub lm_head: Option<Weight>,
    rope: Rope,
    /// The rotation of sliding-window layers, where it differs (Gemma 3).
    rope_local: Option<Rope>,
    /// Whether every product's input rows are rounded to bf16 first
    /// ([`Model::with_bf16_product_inputs`]).
    bf16_inputs: bool,
}

/// What one layer's decode attention saw and produced, for an observer measuring it.
pub struct DecodeView<'a> {
    pub layer: usize,
    pub kv: &'a LayerKv,
    /// The decode sequences of the step, in batch order; row `i` of `q`, `out` and `table`.
    pub seqs: &'a [&'a Sequence],
    /// The pages each sequence (and KV head, for a sparse table) attended to.
    pub table: &'a PageTable,
    /// Queries after RoPE, `[seqs, heads_q, head_dim]`.
    pub q: &'a [f32],
    /// Attention outputs, `[seqs, heads_q, head_dim]`.
    pub out: &'a [f32],
    pub heads_q: usize,
    pub scale: f32,
}

/// Watches decode attention in chosen layers (see [`Model::forward_observed`]).
pub trait DecodeObserver: Send {
    /// Whether [`DecodeObserver::observe`] wants to see `layer` this step.
    fn wants(&self, layer: usize) -> bool;
    fn observe(&mut self, view: DecodeView<'_>);
}

/// One sequence's part of a forward call: the tokens to add and where its state lives.
pub struct SeqStep<'a> {
    pub seq: &'a mut Sequence,
    pub state: &'a mut RequestState,
    pub settings: &'a Settings,
    pub tokens: &'a [u32],
}

#[derive(Debug)]
pub enum ForwardError {
    /// The KV cache has too few free pages for these tokens.
    KvFull {
        needed: usize,
        free: usize,
    },
    /// A sequence would exceed the model's context length.
    TooLong {
        tokens: usize,
        max: usize,
    },
    /// A token id outside the vocabulary.
    BadToken(u32),
    Attention(String),
    /// A sequence in the batch has no new token.
    Empty,
    /// The device running the model failed.
    Backend(String),
    /// The device failed and can run nothing more.
    DeviceLost(String),
}

impl std::fmt::Display for ForwardError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ForwardError::KvFull { needed, free } => {
                write!(f, "KV cache full: {needed} pages needed, {free} free")
            }
            ForwardError::TooLong { tokens, max } => {
                write!(f, "{tokens} tokens exceed the model's context of {max}")
            }
            ForwardError::BadToken(t) => write!(f, "token id {t} is outside the vocabulary"),
            ForwardError::Attention(e) => write!(f, "attention: {e}"),
            ForwardError::Empty => write!(f, "a sequence in the batch has no new token"),
            ForwardError::Backend(e) => write!(f, "{e}"),
            ForwardError::DeviceLost(e) => write!(f, "the device can run nothing more: {e}"),
        }
    }
}

impl std::error::Error for ForwardError {}

impl Model {
    pub fn new(
        config: ModelConfig,
        embed: Weight,
        layers: Vec<LayerWeights>,
        norm: Vec<f32>,
        lm_head: Option<Weight>,
    ) -> Self {
        let rope = Rope::new(&config);
        let rope_local = Rope::local(&config);
        Self {
            config,
            embed,
            layers,
            norm,
            lm_head,
            rope,
            rope_local,
            bf16_inputs: false,
        }
    }

    /// This model with the input rows of every product (projections, FFN, output) rounded to
    /// bf16 before they are multiplied, as a GPU's bf16 products take them. With the GPU's bf16
    /// weights ([`crate::gpu_values::bf16_values`]) the CPU's products then see the GPU's
    /// values, which brings the two closer where they are compared (the rest still differs:
    /// sums in other orders, and the GPU's tensor-core attention rounds its operands). The
    /// GPU's fp8 products take scaled f16 inputs instead; [`crate::gpu_values::fp8_model`]
    /// leaves this off.
    pub fn with_bf16_product_inputs(mut self) -> Self {
        self.bf16_inputs = true;
        self
    }

    /// `rows`, about to be multiplied, as the model's products take them.
    fn product_input<'a>(&self, rows: &'a mut [f32]) -> &'a [f32] {
        if self.bf16_inputs {
            for x in rows.iter_mut() {
                *x = half::bf16::from_f32(*x).to_f32();
            }
        }
        rows
    }

    /// A model of `config`'s shape whose weights live elsewhere (drawn on a GPU): it checks
    /// batches and describes the model, and its own forward pass is an error.
    pub fn without_weights(config: ModelConfig) -> Self {
        let none = Weight::new(
            vortex_kernels::quant::GgmlType::F32,
            0,
            0,
            crate::weights::Bytes::Owned(Default::default()),
        );
        Self::new(config, none, Vec::new(), Vec::new(), None)
    }

    /// Whether the weights are here, for [`Model::forward`].
    pub fn has_weights(&self) -> bool {
        self.layers.len() == self.config.layers
    }

    /// Every matrix a step multiplies by, once.
    fn products(&self) -> impl Iterator<Item = &Weight> {
        self.layers
            .iter()
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down])
            .chain([self.lm_head.as_ref().unwrap_or(&self.embed)])
    }

    /// Bytes of weights one decode step reads (every matrix once).
    pub fn weight_bytes(&self) -> usize {
        self.products().map(Weight::size_bytes).sum()
    }

    /// Regroups the rows of every matrix whose CPU products read them regrouped
    /// ([`Weight::group_rows`]), as the first step would; returns the bytes the groups hold.
    /// A model whose steps run on the CPU calls this once loaded, so no step pays for it.
    pub fn group_rows(&self) -> usize {
        let ws: Vec<&Weight> = self.products().collect();
        ws.par_iter().map(|w| w.group_rows()).sum()
    }

    /// Appends each sequence's tokens to the cache, runs every layer, and returns the logits of
    /// each sequence's last new token. Sequences with one new token decode through the flow's
    /// sparse attention; longer ones prefill with dense causal attention.
    pub fn forward(
        &self,
        kv: &mut KvState,
        batch: &mut [SeqStep],
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        // On a pool thread, the many short parallel regions of a step start from a busy worker
        // instead of waking the pool and blocking the caller each time.
        rayon::scope(|_| self.forward_on_pool(kv, batch, None, None))
    }

    /// [`Model::forward`], scoring also the prompt rows of `scored`: the log-probabilities
    /// of each entry's rows, in its order.
    #[allow(clippy::type_complexity)]
    pub fn forward_scoring(
        &self,
        kv: &mut KvState,
        batch: &mut [SeqStep],
        scored: &[PromptRows],
    ) -> Result<(Vec<Vec<f32>>, Vec<Vec<TokenLogprob>>), ForwardError> {
        check_scored(batch, scored, self.config.vocab)?;
        let mut scores = vec![Vec::new(); scored.len()];
        let logits =
            rayon::scope(|_| self.forward_on_pool(kv, batch, None, Some((scored, &mut scores))))?;
        Ok((logits, scores))
    }

    /// [`Model::forward`], showing each decode layer that `observer` wants to it.
    pub fn forward_observed(
        &self,
        kv: &mut KvState,
        batch: &mut [SeqStep],
        observer: &mut dyn DecodeObserver,
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        rayon::scope(|_| self.forward_on_pool(kv, batch, Some(observer), None))
    }

    /// What every forward pass checks before it touches the cache: each sequence adds tokens
    /// of the vocabulary, runs a loaded flow and stays within the context, and the pool has
    /// the pages. Returns the pages needed and free.
    pub fn check_batch(
        &self,
        kv: &KvState,
        batch: &[SeqStep],
    ) -> Result<(usize, usize), ForwardError> {
        let cfg = &self.config;
        for s in batch {
            if s.tokens.is_empty() {
                return Err(ForwardError::Empty);
            }
            if s.state.flow >= kv.num_flows() {
                return Err(ForwardError::Attention(format!(
                    "flow {} is not loaded",
                    s.state.flow
                )));
            }
            if let Some(&t) = s.tokens.iter().find(|&&t| t as usize >= cfg.vocab) {
                return Err(ForwardError::BadToken(t));
            }
            if s.seq.len + s.tokens.len() > cfg.max_positions {
                return Err(ForwardError::TooLong {
                    tokens: s.seq.len + s.tokens.len(),
                    max: cfg.max_positions,
                });
            }
        }
        let needed: usize = batch
            .iter()
            .map(|s| kv.cache.pages_needed(s.seq, s.tokens.len()))
            .sum();
        let free = kv.cache.allocator().free_count();
        if needed > free {
            return Err(ForwardError::KvFull { needed, free });
        }
        Ok((needed, free))
    }

    fn forward_on_pool(
        &self,
        kv: &mut KvState,
        batch: &mut [SeqStep],
        mut observer: Option<&mut dyn DecodeObserver>,
        scoring: Option<(&[PromptRows], &mut Vec<Vec<TokenLogprob>>)>,
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        let cfg = &self.config;
        let (hidden, d) = (cfg.hidden, cfg.head_dim);
        let (qw, kvw) = (cfg.heads_q * d, cfg.heads_kv * d);
        if !self.has_weights() {
            return Err(ForwardError::Backend(
                "this model's weights are not on the host".into(),
            ));
        }
        if kv.cache.num_layers() != cfg.layers {
            return Err(ForwardError::Backend(format!(
                "the KV cache has {} layers, the model {}",
                kv.cache.num_layers(),
                cfg.layers
            )));
        }
        if let Some(l) = (0..cfg.layers).find(|&l| cfg.window(l).is_none() && !kv.selects_in(l)) {
            return Err(ForwardError::Backend(format!(
                "layer {l} selects pages, but the KV state keeps no summaries for it"
            )));
        }
        let (needed, free) = self.check_batch(kv, batch)?;
        // Token rows of the batch, in order: (page, slot, position) of each.
        let mut slots = Vec::new();
        let mut starts = Vec::with_capacity(batch.len());
        let mut completed: Vec<PageId> = Vec::new();
        for s in batch.iter_mut() {
            starts.push(s.seq.len);
            let start = s.seq.len;
            let new = kv
                .cache
                .append(s.seq, s.tokens.len())
                .map_err(|_| ForwardError::KvFull { needed, free })?;
            for (i, slot) in new.into_iter().enumerate() {
                if slot.completes_page {
                    completed.push(slot.page);
                }
                slots.push((slot.page, slot.offset, start + i));
            }
        }
        let n = slots.len();
        let tokens: Vec<u32> = batch
            .iter()
            .flat_map(|s| s.tokens.iter().copied())
            .collect();
        let mut x = vec![0.0f32; n * hidden];
        for (row, &t) in x.chunks_mut(hidden).zip(&tokens) {
            self.embed.row(t as usize, row);
        }
        if cfg.gemma.is_some() {
            let s = (hidden as f32).sqrt();
            x.iter_mut().for_each(|v| *v *= s);
        }
        let mut h = vec![0.0f32; n * hidden];
        let (mut q, mut k, mut v) = (vec![0.0; n * qw], vec![0.0; n * kvw], vec![0.0; n * kvw]);
        let mut attn = vec![0.0f32; n * qw];
        let mut o = vec![0.0f32; n * hidden];
        let (mut gate, mut up) = (vec![0.0; n * cfg.ffn], vec![0.0; n * cfg.ffn]);
        let mut cos_sin = Vec::new();
        let scale = 1.0 / cfg.gemma.map_or(d as f32, |g| g.query_scalar).sqrt();
        let simd = Simd::detect();
        // Decoding sequences, grouped by the flow they run.
        let mut decode_groups = vec![Vec::new(); kv.num_flows()];
        for (b, s) in batch.iter().enumerate() {
            if s.tokens.len() == 1 {
                decode_groups[s.state.flow].push(b);
            }
        }
        let first_row: Vec<usize> = batch
            .iter()
            .scan(0, |acc, s| {
                let r = *acc;
                *acc += s.tokens.len();
                Some(r)
            })
            .collect();
        let mut table = PageTable::default();
        let (mut q_dec, mut out_dec) = (Vec::new(), Vec::new());

        for (l, lw) in self.layers.iter().enumerate() {
            // A sliding-window layer attends to its window, the flow's selection aside.
            let window = cfg.window(l);
            let rope = match window {
                Some(_) => self.rope_local.as_ref().unwrap_or(&self.rope),
                None => &self.rope,
            };
            rms_norm(&x, &lw.attn_norm, cfg.rms_eps, &mut h);
            Weight::matmul_many(
                &[&lw.wq, &lw.wk, &lw.wv],
                self.product_input(&mut h),
                n,
                &mut [&mut q, &mut k, &mut v],
            );
            if let Some([bq, bk, bv]) = &lw.bias {
                add_rows(&mut q, bq);
                add_rows(&mut k, bk);
                add_rows(&mut v, bv);
            }
            if let Some([qn, kn]) = &lw.qk_norm {
                head_norm(&mut q, qn, cfg.rms_eps);
                head_norm(&mut k, kn, cfg.rms_eps);
            }
            let layer = kv.cache.layer_mut(l);
            for (r, &(page, offset, pos)) in slots.iter().enumerate() {
                rope.apply(&mut q[r * qw..(r + 1) * qw], pos, &mut cos_sin);
                rope.apply(&mut k[r * kvw..(r + 1) * kvw], pos, &mut cos_sin);
                layer
                    .write_token(
                        page,
                        offset,
                        &k[r * kvw..(r + 1) * kvw],
                        &v[r * kvw..(r + 1) * kvw],
                    )
                    .map_err(|e| ForwardError::Attention(e.to_string()))?;
            }
            // A sliding-window layer's pages are never chosen: nothing reads their summaries.
            if !completed.is_empty() && window.is_none() {
                let layer = kv.cache.layer(l);
                kv.flow.summarize(layer, &mut kv.fields[l], &completed);
                for slot in &mut kv.others {
                    slot.runner
                        .summarize(layer, &mut slot.fields[l], &completed);
                }
            }
            let layer = kv.cache.layer(l);
            for (b, s) in batch.iter().enumerate() {
                if s.tokens.len() == 1 {
                    continue;
                }
                let rows = first_row[b]..first_row[b] + s.tokens.len();
                prefill_attention_with(
                    simd,
                    window,
                    layer,
                    &s.seq.pages,
                    starts[b],
                    &q[rows.start * qw..rows.end * qw],
                    cfg.heads_q,
                    scale,
                    &mut attn[rows.start * qw..rows.end * qw],
                )
                .map_err(|e| ForwardError::Attention(e.to_string()))?;
            }
            if window.is_some() {
                // Decoding rows attend to their windows side by side, each into its own row.
                let mut rows = attn.chunks_mut(qw).zip(q.chunks(qw));
                let mut taken = 0;
                let decoding: Vec<_> = batch
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.tokens.len() == 1)
                    .map(|(b, s)| {
                        let row = rows.nth(first_row[b] - taken).expect("a row per token");
                        taken = first_row[b] + 1;
                        (row, &s.seq.pages[..], starts[b])
                    })
                    .collect();
                decoding
                    .into_par_iter()
                    .try_for_each(|((out, q), pages, start)| {
                        prefill_attention_with(
                            simd,
                            window,
                            layer,
                            pages,
                            start,
                            q,
                            cfg.heads_q,
                            scale,
                            out,
                        )
                    })
                    .map_err(|e| ForwardError::Attention(e.to_string()))?;
            }
            let flow_groups = if window.is_none() {
                &decode_groups[..]
            } else {
                &[]
            };
            for (f, group) in flow_groups.iter().enumerate() {
                if group.is_empty() {
                    continue;
                }
                let (runner, fields) = kv.flow_at(f).expect("flow indices checked above");
                q_dec.resize(group.len() * qw, 0.0);
                out_dec.resize(group.len() * qw, 0.0);
                for (i, &b) in group.iter().enumerate() {
                    let r = first_row[b];
                    q_dec[i * qw..(i + 1) * qw].copy_from_slice(&q[r * qw..(r + 1) * qw]);
                }
                let mut steps: Vec<StepSeq> = batch
                    .iter_mut()
                    .filter(|s| s.tokens.len() == 1 && s.state.flow == f)
                    .map(|s| StepSeq {
                        seq: &*s.seq,
                        settings: s.settings,
                        state: Some(&mut s.state.layers[l]),
                    })
                    .collect();
                runner.select(l, &fields[l], &q_dec, &mut steps, &mut table);
                decode_attention(layer, &table, &q_dec, cfg.heads_q, scale, &mut out_dec)
                    .map_err(|e| ForwardError::Attention(e.to_string()))?;
                if let Some(obs) = observer.as_deref_mut().filter(|o| o.wants(l)) {
                    let seqs: Vec<&Sequence> = steps.iter().map(|s| s.seq).collect();
                    obs.observe(DecodeView {
                        layer: l,
                        kv: layer,
                        seqs: &seqs,
                        table: &table,
                        q: &q_dec,
                        out: &out_dec,
                        heads_q: cfg.heads_q,
                        scale,
                    });
                }
                for (i, &b) in group.iter().enumerate() {
                    let r = first_row[b];
                    attn[r * qw..(r + 1) * qw].copy_from_slice(&out_dec[i * qw..(i + 1) * qw]);
                }
            }
            lw.wo.matmul(self.product_input(&mut attn), n, &mut o);
            self.join_residual(&mut x, &o, lw.post_norms.as_ref().map(|[a, _]| a), &mut h);
            rms_norm(&x, &lw.ffn_norm, cfg.rms_eps, &mut h);
            Weight::matmul_many(
                &[&lw.gate, &lw.up],
                self.product_input(&mut h),
                n,
                &mut [&mut gate, &mut up],
            );
            if cfg.gemma.is_some() {
                gelu_mul(&mut gate, &up);
            } else {
                silu_mul(&mut gate, &up);
            }
            lw.down.matmul(self.product_input(&mut gate), n, &mut o);
            self.join_residual(&mut x, &o, lw.post_norms.as_ref().map(|[_, f]| f), &mut h);
        }
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        let mut last = vec![0.0f32; batch.len() * hidden];
        for (b, s) in batch.iter().enumerate() {
            let r = first_row[b] + s.tokens.len() - 1;
            rms_norm(
                &x[r * hidden..(r + 1) * hidden],
                &self.norm,
                cfg.rms_eps,
                &mut last[b * hidden..(b + 1) * hidden],
            );
        }
        let mut logits = vec![0.0f32; batch.len() * cfg.vocab];
        head.matmul(self.product_input(&mut last), batch.len(), &mut logits);
        if let Some((scored, scores)) = scoring {
            self.score_rows(&x, &first_row, scored, scores);
        }
        Ok(logits.chunks(cfg.vocab).map(<[f32]>::to_vec).collect())
    }

    /// `x += out`, normed first where the layer norms its outputs (`scratch` holds the norm).
    fn join_residual(
        &self,
        x: &mut [f32],
        out: &[f32],
        norm: Option<&Vec<f32>>,
        scratch: &mut [f32],
    ) {
        match norm {
            Some(w) => {
                rms_norm(out, w, self.config.rms_eps, scratch);
                add(x, scratch);
            }
            None => add(x, out),
        }
    }

    /// The log-probabilities of the rows `scored` asks for, into `scores` (an entry each),
    /// from logits computed [`SCORED_ROWS`] at a time.
    fn score_rows(
        &self,
        x: &[f32],
        first_row: &[usize],
        scored: &[PromptRows],
        scores: &mut [Vec<TokenLogprob>],
    ) {
        let cfg = &self.config;
        let (hidden, vocab) = (cfg.hidden, cfg.vocab);
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        let mut normed = vec![0.0f32; SCORED_ROWS * hidden];
        let mut logits = vec![0.0f32; SCORED_ROWS * vocab];
        for (p, out) in scored.iter().zip(scores) {
            let rows = p.next.len();
            for start in (0..rows).step_by(SCORED_ROWS) {
                let count = (rows - start).min(SCORED_ROWS);
                let r = first_row[p.seq] + start;
                for i in 0..count {
                    rms_norm(
                        &x[(r + i) * hidden..(r + i + 1) * hidden],
                        &self.norm,
                        cfg.rms_eps,
                        &mut normed[i * hidden..(i + 1) * hidden],
                    );
                }
                head.matmul(
                    self.product_input(&mut normed[..count * hidden]),
                    count,
                    &mut logits[..count * vocab],
                );
                for i in 0..count {
                    let row = &logits[i * vocab..(i + 1) * vocab];
                    out.push(token_logprob(row, p.next[start + i], p.top));
                }
            }
        }
    }
}

/// That each entry of `scored` names a sequence of `batch`, at most its new rows, and tokens
/// of the vocabulary.
pub fn check_scored(
    batch: &[SeqStep],
    scored: &[PromptRows],
    vocab: usize,
) -> Result<(), ForwardError> {
    for r in scored {
        if batch
            .get(r.seq)
            .is_none_or(|s| r.next.len() > s.tokens.len())
        {
            return Err(ForwardError::Backend(format!(
                "{} prompt rows of sequence {} scored in a pass of {} sequences",
                r.next.len(),
                r.seq,
                batch.len()
            )));
        }
        if let Some(&t) = r.next.iter().find(|&&t| t as usize >= vocab) {
            return Err(ForwardError::BadToken(t));
        }
    }
    Ok(())
}

/// Rows of a prompt scored at a time: a block of logits, not the chunk's whole.
const SCORED_ROWS: usize = 16;

fn add(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

fn add_rows(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_mut(bias.len()) {
        add(row, bias);
    }
}
