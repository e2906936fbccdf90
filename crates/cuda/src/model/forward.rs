//! The forward pass: host work first (pages, rows, page tables, attention plans, all copies to
//! the device), then the kernels of every layer, launched one by one or replayed from a captured
//! graph (`graphs.rs`).

use vortex_kv::{PageTable, Sequence};

use super::profile::Stage;
use super::{GpuModel, GpuStep, PlacedStep};
use crate::attention::AttnOut;
use crate::blas::Blas;
use crate::layer_kernels::QkvExtras;
use crate::prefill::{PrefillSeq, tiles};
use crate::{CudaError, DeviceTable};

/// What a pass adds, in batch order.
pub(super) struct Pass<'a> {
    pub n: usize,
    pub seqs: usize,
    pub decode_only: bool,
    pub prefill: &'a [PrefillSeq],
    /// Per layer: the selection whose sparse table it attends through, if any.
    pub sparse: &'a [Option<usize>],
}

impl GpuModel {
    /// Appends each step's tokens to its sequence (pages from this model's allocator) and runs
    /// every layer; the logits of each sequence's last new token are left on the device (see
    /// [`logits`](Self::logits) and [`argmax`](Self::argmax)). A pass where every sequence adds
    /// one token decodes with the flow's attention; any other runs dense causal attention for
    /// all its rows.
    pub fn forward(&mut self, batch: &mut [GpuStep]) -> Result<(), CudaError> {
        self.takes_picks(batch.len(), batch.iter().all(|s| s.tokens.len() == 1))?;
        let needed: usize = batch
            .iter()
            .map(|s| {
                self.geom
                    .pages_for(s.seq.len + s.tokens.len())
                    .saturating_sub(s.seq.pages.len())
            })
            .sum();
        if needed > self.allocator.free_count() {
            return Err(CudaError::Invalid(format!(
                "KV pool full: {needed} pages needed, {} free",
                self.allocator.free_count()
            )));
        }
        for s in batch.iter() {
            self.check_tokens(s.seq.len, s.tokens)?;
        }
        for s in batch.iter_mut() {
            let len = s.seq.len + s.tokens.len();
            while s.seq.pages.len() < self.geom.pages_for(len) {
                let p = self
                    .allocator
                    .allocate()
                    .map_err(|e| CudaError::Invalid(format!("KV pool: {e} (checked above)")))?;
                s.seq.pages.push(p);
            }
            s.seq.len = len;
        }
        let placed: Vec<PlacedStep> = batch
            .iter()
            .map(|s| PlacedStep {
                seq: &*s.seq,
                tokens: s.tokens,
                settings: None,
                state: s.state,
                flow: s.flow,
            })
            .collect();
        self.forward_placed(&placed)
    }

    /// [`forward`](Self::forward) for sequences whose new tokens already count in their length
    /// and have their pages (allocated by the caller over the same page ids, as a serving
    /// engine does).
    pub fn forward_placed(&mut self, batch: &[PlacedStep]) -> Result<(), CudaError> {
        let decode_only = batch.iter().all(|s| s.tokens.len() == 1);
        let picked = self.takes_picks(batch.len(), decode_only)?;
        let page = self.geom.page_size;
        let (mut tokens, mut pos, mut slots, mut completed) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut last_rows = Vec::with_capacity(batch.len());
        let mut prefill = Vec::new();
        for (b, s) in batch.iter().enumerate() {
            let start = s.seq.len.checked_sub(s.tokens.len()).ok_or_else(|| {
                CudaError::Invalid("a sequence is shorter than its new tokens".into())
            })?;
            self.check_tokens(start, s.tokens)?;
            if s.seq.pages.len() != self.geom.pages_for(s.seq.len)
                || s.seq
                    .pages
                    .iter()
                    .any(|&p| p as usize >= self.allocator.total())
            {
                return Err(CudaError::Invalid(
                    "a sequence's pages must hold its tokens exactly, within the pool".into(),
                ));
            }
            prefill.push(PrefillSeq {
                first_row: tokens.len(),
                tokens: s.tokens.len(),
                start,
                table_row: b,
            });
            for (i, &t) in s.tokens.iter().enumerate() {
                let at = start + i;
                let p = s.seq.pages[at / page];
                tokens.push(t);
                pos.push(at as i32);
                slots.extend([p, (at % page) as u32]);
                if (at + 1).is_multiple_of(page) {
                    completed.push(p);
                }
            }
            last_rows.push((tokens.len() - 1) as i32);
        }
        let seqs: Vec<&Sequence> = batch.iter().map(|s| s.seq).collect();
        let rows = self.config.layers * batch.len() * self.geom.kv_heads;
        self.recall.begin(&self.dev, decode_only, rows);
        let dense = DeviceTable::upload_reusing(
            &self.dev,
            &PageTable::dense(&seqs, page),
            self.geom.kv_heads,
            page,
            self.allocator.total(),
            self.dense_table.take(),
        )?;
        let seq_tokens: Vec<usize> = seqs.iter().map(|s| s.len).collect();
        let n = tokens.len();
        self.scratch.prepare(
            &self.dev,
            &self.config,
            n,
            decode_only,
            batch.len(),
            &tokens,
            &pos,
            &slots,
            &last_rows,
        )?;
        self.scratch.completed.load(&self.dev, &completed)?;
        if picked {
            self.take_picks(batch.len())?;
        }
        let mut sparse = vec![None; self.config.layers];
        if decode_only {
            self.dense_attn.prepare(&self.dev, &dense)?;
            self.prepare_selection(&dense, &seq_tokens, batch, &mut sparse)?;
            self.prepare_window(&seqs)?;
        } else {
            let t: Vec<i32> = tiles(&prefill, self.prefill.tile_tokens).concat();
            self.scratch.load_tiles(&self.dev, &t)?;
        }
        let pass = Pass {
            n,
            seqs: batch.len(),
            decode_only,
            prefill: &prefill,
            sparse: &sparse,
        };
        let result = self.launch(&dense, &pass);
        self.dense_table = Some(dense);
        self.logit_rows = batch.len();
        self.pass_rows = n;
        result
    }

    /// Token ids in the vocabulary, and the sequence within the model's context.
    fn check_tokens(&self, start: usize, tokens: &[u32]) -> Result<(), CudaError> {
        let cfg = &self.config;
        if tokens.is_empty() {
            return Err(CudaError::Invalid(
                "a sequence in the batch has no new token".into(),
            ));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= cfg.vocab) {
            return Err(CudaError::Invalid(format!(
                "token id {t} is outside the vocabulary of {}",
                cfg.vocab
            )));
        }
        if start + tokens.len() > cfg.max_positions {
            return Err(CudaError::Invalid(format!(
                "{} tokens exceed the model's context of {}",
                start + tokens.len(),
                cfg.max_positions
            )));
        }
        Ok(())
    }

    /// Queues the pass's kernels one by one (into a graph while one is being captured).
    pub(super) fn launch_kernels(
        &mut self,
        dense: &DeviceTable,
        pass: &Pass,
    ) -> Result<(), CudaError> {
        let Pass {
            n,
            seqs,
            decode_only,
            prefill,
            sparse,
        } = *pass;
        let cfg = &self.config;
        let (hq, d) = (cfg.heads_q, cfg.head_dim);
        let scale = 1.0 / cfg.gemma.map_or(d as f32, |g| g.query_scalar).sqrt();
        let embed_scale = cfg.gemma.map_or(1.0, |_| (cfg.hidden as f32).sqrt());
        let dev = &self.dev;
        let sc = &mut self.scratch;
        macro_rules! mark {
            ($stage:expr) => {
                if let Some(p) = self.profiler.as_mut() {
                    p.mark(dev, $stage)?;
                }
            };
        }
        mark!(Stage::Start);
        let lk = &self.layer_kernels;
        let q = if decode_only {
            &mut *sc.q
        } else {
            &mut *sc.q_prefill
        };
        lk.embed(
            dev,
            self.weights.embed_table()?,
            &sc.tokens,
            n,
            cfg.hidden,
            embed_scale,
            &mut sc.x,
        )?;
        // A product joins the residual stream: added by the product itself, or (Gemma 3) through
        // a norm of its output.
        macro_rules! into_residual {
            ($x:expr, $input:expr, $w:expr, $norm:expr) => {
                match $norm {
                    Some(norm) => {
                        self.blas
                            .matmul(dev, $x, $input, n, $w, &mut sc.post, false)?;
                        mark!(Stage::Matmul);
                        lk.rms_norm_add(dev, &sc.post, n, norm, cfg.rms_eps, &mut sc.x)?;
                        mark!(Stage::Elementwise);
                    }
                    None => {
                        self.blas.matmul(dev, $x, $input, n, $w, &mut sc.x, true)?;
                        mark!(Stage::Matmul);
                    }
                }
            };
        }
        for (l, lw) in self.weights.layers.iter().enumerate() {
            let kv = &mut self.kv[l];
            // A sliding-window layer attends to its window, the flow's selection aside.
            let window = cfg.window(l);
            let rope = match window {
                Some(_) => self.rope_local.as_ref().unwrap_or(&self.rope),
                None => &self.rope,
            };
            let input = Blas::input_for(n, &lw.qkv);
            lk.rms_norm(
                dev,
                &sc.x,
                None,
                n,
                &lw.attn_norm,
                cfg.rms_eps,
                &mut sc.h,
                input,
            )?;
            mark!(Stage::Elementwise);
            self.blas
                .matmul(dev, &sc.h, input, n, &lw.qkv, &mut sc.qkv, false)?;
            mark!(Stage::Matmul);
            let extras = QkvExtras {
                bias: lw.bias.as_ref(),
                q_norm: lw.q_norm.as_ref(),
                k_norm: lw.k_norm.as_ref(),
                eps: cfg.rms_eps,
            };
            lk.qkv_post(
                dev, &sc.qkv, n, hq, &extras, rope, &sc.pos, &sc.slots, q, kv,
            )?;
            mark!(Stage::Elementwise);
            // A sliding-window layer's pages are never chosen: nothing reads their summaries.
            if !sc.completed.is_empty() && window.is_none() {
                let others = self.others.iter_mut().map(|o| &mut o.gpu);
                for flow in std::iter::once(&mut self.flow).chain(others) {
                    flow.summarize(dev, &self.kv_kernels, l, kv, &sc.completed)?;
                }
                mark!(Stage::Cache);
            }
            // A decode pass's attention writes the o product's input itself.
            let input = Blas::input_for(n, &lw.wo);
            let attn_in = &mut sc.attn_in;
            if !decode_only {
                let attn = &mut sc.attn_prefill;
                self.prefill
                    .run(dev, kv, dense, prefill, &sc.tiles, q, scale, window, attn)?;
                mark!(Stage::Attention);
                lk.to_input(dev, attn, n * hq * d, attn_in, input)?;
                mark!(Stage::Elementwise);
            } else if window.is_some() {
                let (Some(attn), Some(table)) = (&mut self.window_attn, &self.window_table) else {
                    return Err(CudaError::Invalid(
                        "a decode pass of sliding-window layers has no window table".into(),
                    ));
                };
                attn.launch(dev, kv, table, q, scale, AttnOut::Input(attn_in, input))?;
                mark!(Stage::Attention);
            } else if let Some(i) = sparse[l] {
                let sel = &mut self.selections[i];
                let table = sel.table.as_mut().expect("prepared with the rows");
                for launch in &sel.launches {
                    let flow = super::flow_in(&self.flow, &self.others, launch.flow);
                    let flow = flow.expect("checked");
                    flow.select(dev, l, dense, kv.num_pages, q, launch.rows(), table)?;
                }
                mark!(Stage::Index);
                let out = AttnOut::Input(attn_in, input);
                sel.attn.launch(dev, kv, table, q, scale, out)?;
                mark!(Stage::Attention);
                if self.recall.measuring() {
                    let group = hq / self.geom.kv_heads;
                    let launches = &sel.launches;
                    self.recall
                        .layer(dev, kv, dense, table, launches, q, scale, group);
                }
            } else {
                let out = AttnOut::Input(attn_in, input);
                self.dense_attn.launch(dev, kv, dense, q, scale, out)?;
                mark!(Stage::Attention);
            }
            let after_attn = lw.post_norms.as_ref().map(|[a, _]| a);
            into_residual!(&sc.attn_in, input, &lw.wo, after_attn);
            let input = Blas::input_for(n, &lw.gate_up);
            lk.rms_norm(
                dev,
                &sc.x,
                None,
                n,
                &lw.ffn_norm,
                cfg.rms_eps,
                &mut sc.h,
                input,
            )?;
            mark!(Stage::Elementwise);
            self.blas
                .matmul(dev, &sc.h, input, n, &lw.gate_up, &mut sc.gu, false)?;
            mark!(Stage::Matmul);
            let input = Blas::input_for(n, &lw.down);
            let gelu = cfg.gemma.is_some();
            lk.gate_mul(dev, &sc.gu, n, cfg.ffn, gelu, &mut sc.act, input)?;
            mark!(Stage::Elementwise);
            let after_ffn = lw.post_norms.as_ref().map(|[_, f]| f);
            into_residual!(&sc.act, input, &lw.down, after_ffn);
        }
        // The final norm of each sequence's last row and the output projection.
        let input = Blas::input_for(seqs, self.weights.head());
        lk.rms_norm(
            dev,
            &sc.x,
            Some(&sc.last_rows),
            seqs,
            &self.weights.norm,
            cfg.rms_eps,
            &mut sc.last,
            input,
        )?;
        mark!(Stage::Elementwise);
        self.blas.matmul(
            dev,
            &sc.last,
            input,
            seqs,
            self.weights.head(),
            &mut sc.logits,
            false,
        )?;
        mark!(Stage::Matmul);
        Ok(())
    }
}
