//! A GPU model as the serving engine's forward pass: the engine allocates pages from its own
//! pool (no storage on the host) and the GPU pool holds the same pages.

use vortex_flow::Flow;
use vortex_kv::Sequence;
use vortex_model::logprob::TokenLogprob;
use vortex_model::model::{
    ForwardError, ForwardPass, KvState, Model, Next, PromptRows, Scored, SeqStep, Wants,
    check_scored,
};
use vortex_model::sampling::DeviceDraw;

use super::{GpuModel, PlacedStep, StepRecall};
use crate::logprobs::Logprobs;

/// The engine's forward passes on a GPU. Decode rows and prefill rows of one engine step run
/// as two passes: a pass with a prefill attends densely, and decode rows must run the flow.
pub struct CudaPass {
    pub gpu: GpuModel,
    recall: Option<MeasureEvery>,
}

/// Measures one decode pass in every `every` and reports what it found.
struct MeasureEvery {
    every: u64,
    passes: u64,
    report: Box<dyn FnMut(&StepRecall) + Send>,
}

impl ForwardPass for CudaPass {
    fn forward(
        &mut self,
        model: &Model,
        kv: &mut KvState,
        batch: &mut [SeqStep],
        wants: &[Wants],
    ) -> Result<Vec<Next>, ForwardError> {
        Ok(self.run(model, kv, batch, wants, &[])?.0)
    }

    fn scores_prompts(&self) -> bool {
        true
    }

    fn forward_scoring(
        &mut self,
        model: &Model,
        kv: &mut KvState,
        batch: &mut [SeqStep],
        wants: &[Wants],
        scored: &[PromptRows],
    ) -> Result<Scored, ForwardError> {
        check_scored(batch, scored, model.config.vocab)?;
        self.run(model, kv, batch, wants, scored)
    }

    fn load_flow(&mut self, flow: &Flow, seqs: &[&Sequence]) -> Result<(), String> {
        self.gpu
            .add_flow(flow, seqs)
            .map(|_| ())
            .map_err(|e| match e {
                crate::CudaError::Unsupported(_) => {
                    format!("flow '{}' cannot run on {}: {e}", flow.name, self.device())
                }
                e => format!(
                    "flow '{}' could not be loaded on {}: {e}; a server whose KV pool fills the \
                 --gpu-memory-utilization share sets memory aside for the flows named in \
                 --flows; otherwise give the pool less memory",
                    flow.name,
                    self.device()
                ),
            })
    }

    fn scores_logprobs(&self) -> bool {
        true
    }

    fn picks_ahead(&self, wants: &Wants) -> bool {
        device_draw(wants).is_some()
    }

    fn masks_ahead(&self) -> bool {
        true
    }

    fn queue_decode(
        &mut self,
        model: &Model,
        kv: &mut KvState,
        batch: &mut [SeqStep],
        picked: bool,
    ) -> Result<(), ForwardError> {
        if picked != self.gpu.picks_pending() {
            return Err(if picked {
                ForwardError::Backend("no tokens were picked ahead for this pass".into())
            } else {
                unread()
            });
        }
        if batch.iter().any(|s| s.tokens.len() != 1) {
            return Err(ForwardError::Backend(
                "a pass queued ahead decodes one token a sequence".into(),
            ));
        }
        self.place(model, kv, batch)?;
        let placed: Vec<PlacedStep> = batch.iter().map(placed).collect();
        self.forward_measured(&placed)
    }

    fn pick_ahead(&mut self, wants: &[Wants]) -> Result<(), ForwardError> {
        let picks = wants
            .iter()
            .map(|w| {
                device_draw(w).ok_or_else(|| {
                    ForwardError::Backend(format!("{w:?} cannot be picked ahead on the device"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let wants: Vec<&Wants> = wants.iter().collect();
        let (rows, top) = scored_rows(&wants);
        if !rows.is_empty() {
            self.gpu.queue_logprobs(&rows, top).map_err(backend)?;
        }
        self.gpu.mask_rows(&masks_of(&wants)).map_err(backend)?;
        self.gpu.pick_ahead(&picks).map_err(backend)?;
        if !rows.is_empty() {
            // A pick a row: row r's token is pick r.
            self.gpu.send_logprobs_back(&rows).map_err(backend)?;
        }
        Ok(())
    }

    fn picked(&mut self) -> Result<Vec<Next>, ForwardError> {
        let mut picked: Vec<Next> = self
            .gpu
            .picked()
            .map_err(backend)?
            .into_iter()
            .map(Next::Token)
            .collect();
        for (r, lp) in self
            .gpu
            .logprobs_back()
            .map_err(backend)?
            .unwrap_or_default()
        {
            if let Some(&Next::Token(token)) = picked.get(r) {
                picked[r] = Next::Scored {
                    token,
                    logprob: lp.token,
                    top: lp.top,
                };
            }
        }
        Ok(picked)
    }

    fn discard_ahead(&mut self) {
        self.gpu.discard_picks();
    }

    fn device(&self) -> String {
        format!("cuda:{}", self.gpu.dev.ordinal)
    }
}

impl CudaPass {
    pub fn new(gpu: GpuModel) -> Self {
        Self { gpu, recall: None }
    }

    /// A step's passes (its prefill rows, then its decode rows), with the prompt rows of
    /// `scored` scored after the pass they are in.
    fn run(
        &mut self,
        model: &Model,
        kv: &mut KvState,
        batch: &mut [SeqStep],
        wants: &[Wants],
        scored: &[PromptRows],
    ) -> Result<Scored, ForwardError> {
        if wants.len() != batch.len() {
            return Err(ForwardError::Backend(format!(
                "{} wants for {} sequences",
                wants.len(),
                batch.len()
            )));
        }
        if self.gpu.picks_pending() {
            return Err(unread());
        }
        self.place(model, kv, batch)?;
        let (decode, prefill): (Vec<usize>, Vec<usize>) =
            (0..batch.len()).partition(|&i| batch[i].tokens.len() == 1);
        let mut out = vec![Next::Nothing; batch.len()];
        let mut scores = vec![Vec::new(); scored.len()];
        for group in [prefill, decode] {
            if group.is_empty() {
                continue;
            }
            let placed: Vec<PlacedStep> = group.iter().map(|&i| placed(&batch[i])).collect();
            self.forward_measured(&placed)?;
            // Greedy rows and draws at a temperature take their token from the device;
            // only rows that sample otherwise copy their logits back.
            let sampled: Vec<usize> = (0..group.len())
                .filter(|&r| wants[group[r]] == Wants::Logits)
                .collect();
            for (r, logits) in sampled
                .iter()
                .zip(self.gpu.logits_of(&sampled).map_err(backend)?)
            {
                out[group[*r]] = Next::Logits(logits);
            }
            // Rows that ask for log-probabilities take them from the logits before a mask.
            let group_wants: Vec<&Wants> = group.iter().map(|&i| &wants[i]).collect();
            let (lp_rows, top) = scored_rows(&group_wants);
            if !lp_rows.is_empty() {
                self.gpu.queue_logprobs(&lp_rows, top).map_err(backend)?;
            }
            // Rows held to a grammar are drawn like the others once their logits are masked.
            self.gpu
                .mask_rows(&masks_of(&group_wants))
                .map_err(backend)?;
            let picks: Vec<(usize, DeviceDraw)> = (0..group.len())
                .filter_map(|r| Some((r, device_draw(group_wants[r])?)))
                .collect();
            for (p, id) in picks.iter().zip(self.gpu.draw(&picks).map_err(backend)?) {
                out[group[p.0]] = Next::Token(id);
            }
            if !lp_rows.is_empty() {
                let pick_of: Vec<usize> = lp_rows
                    .iter()
                    .map(|&r| picks.iter().position(|p| p.0 == r).unwrap_or(usize::MAX))
                    .collect();
                let lps = self.gpu.finish_logprobs(&pick_of).map_err(backend)?;
                for (&r, lp) in lp_rows.iter().zip(lps) {
                    if let Next::Token(token) = out[group[r]] {
                        out[group[r]] = Next::Scored {
                            token,
                            logprob: lp.token,
                            top: lp.top,
                        };
                    }
                }
            }
            if !scored.is_empty() {
                self.score_prompts(batch, &group, scored, &mut scores)?;
            }
        }
        Ok((out, scores))
    }

    /// The scores of the prompt rows of `scored` in the pass just run over `group` (its
    /// sequences' new rows one after another), into `scores`.
    fn score_prompts(
        &mut self,
        batch: &[SeqStep],
        group: &[usize],
        scored: &[PromptRows],
        scores: &mut [Vec<TokenLogprob>],
    ) -> Result<(), ForwardError> {
        let mut first = 0;
        for &i in group {
            for (p, out) in scored.iter().zip(&mut *scores).filter(|(p, _)| p.seq == i) {
                let rows: Vec<usize> = (first..first + p.next.len()).collect();
                let lps = self.gpu.score_rows(&rows, p.next, p.top);
                let lps = lps.map_err(backend)?.into_iter().zip(p.next);
                let scored = |(lp, &token): (Logprobs, &u32)| TokenLogprob {
                    token,
                    logprob: lp.token,
                    top: lp.top,
                    rank: None,
                };
                *out = lps.map(scored).collect();
            }
            first += batch[i].tokens.len();
        }
        Ok(())
    }

    /// Measures one decode pass in every `every` (at least 1): each sparse layer's kept pages
    /// against exact attention over all of them, what it found given to `report` (as the
    /// CPU's `vortex serve --recall-every`).
    pub fn measuring(mut self, every: u64, report: Box<dyn FnMut(&StepRecall) + Send>) -> Self {
        self.recall = Some(MeasureEvery {
            every: every.max(1),
            passes: 0,
            report,
        });
        self
    }

    /// Runs a pass, measured when it decodes and its turn has come.
    fn forward_measured(&mut self, placed: &[PlacedStep]) -> Result<(), ForwardError> {
        let due = match &mut self.recall {
            Some(m) if placed.iter().all(|s| s.tokens.len() == 1) => {
                m.passes += 1;
                m.passes.is_multiple_of(m.every)
            }
            _ => false,
        };
        if due {
            self.gpu.measure_next_decode();
        }
        self.gpu.forward_placed(placed).map_err(backend)?;
        match (self.gpu.take_recall(), &mut self.recall) {
            (Some(Ok(found)), Some(m)) if found.rows > 0 => (m.report)(&found),
            // Measuring is a probe: the pass it could not measure still ran.
            (Some(Err(e)), _) => eprintln!("vortex: a measured decode pass: {e}"),
            _ => {}
        }
        Ok(())
    }

    /// Gives each sequence its state slot and pages for its new tokens, as the host allocator
    /// hands them out (copying a shared page's keys and values where it is copied on write).
    fn place(
        &mut self,
        model: &Model,
        kv: &mut KvState,
        batch: &mut [SeqStep],
    ) -> Result<(), ForwardError> {
        if let Some(s) = batch.iter().find(|s| s.state.flow >= self.gpu.num_flows()) {
            return Err(ForwardError::Attention(format!(
                "flow {} is not loaded on {}",
                s.state.flow,
                self.device()
            )));
        }
        let (needed, free) = model.check_batch(kv, batch)?;
        for s in batch.iter_mut() {
            // A request's first pass gives it a state slot if its flow keeps state (so does
            // a pass after the flow was replaced: the old slot's state is gone with it).
            let flow = self.gpu.flow_at(s.state.flow).expect("checked above");
            if flow.keeps_state() && !s.state.slot.as_ref().is_some_and(|x| flow.owns_slot(x)) {
                s.state.slot = self.gpu.state_slot_for(s.state.flow).map_err(backend)?;
            }
            let before = s.seq.pages.clone();
            kv.cache
                .append(s.seq, s.tokens.len())
                .map_err(|_| ForwardError::KvFull { needed, free })?;
            // A shared partly filled page is copied on write by the host allocator: copy its
            // keys and values on the device too.
            for (&old, &new) in before.iter().zip(&s.seq.pages) {
                if old != new {
                    self.gpu.copy_page(old, new).map_err(backend)?;
                }
            }
        }
        Ok(())
    }
}

fn placed<'a>(s: &'a SeqStep) -> PlacedStep<'a> {
    PlacedStep {
        seq: &*s.seq,
        tokens: s.tokens,
        settings: Some(s.settings),
        state: s.state.slot.as_ref(),
        flow: s.state.flow,
    }
}

/// The grammar masks among a pass's `wants`, each with its row.
fn masks_of<'a>(wants: &[&'a Wants]) -> Vec<(usize, &'a [u64])> {
    (0..wants.len())
        .filter_map(|r| Some((r, mask(wants[r])?)))
        .collect()
}

/// The token set a row is held to, if any.
fn mask(w: &Wants) -> Option<&[u64]> {
    match w {
        Wants::MaskedDraw(_, allowed) => Some(allowed.words()),
        Wants::Scored(inner, _) => mask(inner),
        _ => None,
    }
}

/// The rows of `wants` that ask for log-probabilities, and the most best tokens one asks for
/// (the engine keeps each request's own number).
fn scored_rows(wants: &[&Wants]) -> (Vec<usize>, usize) {
    let mut top = 0;
    let rows = (0..wants.len())
        .filter(|&r| match wants[r] {
            Wants::Scored(_, k) => {
                top = top.max(*k);
                true
            }
            _ => false,
        })
        .collect();
    (rows, top)
}

/// How the device draws a row's token (after its mask), if it does.
fn device_draw(w: &Wants) -> Option<DeviceDraw> {
    match w {
        Wants::MaskedDraw(d, _) => Some(*d),
        Wants::Scored(inner, _) => device_draw(inner),
        w => w.device_pick(),
    }
}

fn backend(e: crate::CudaError) -> ForwardError {
    if e.is_fatal() {
        ForwardError::DeviceLost(e.to_string())
    } else {
        ForwardError::Backend(e.to_string())
    }
}

fn unread() -> ForwardError {
    ForwardError::Backend("tokens picked ahead are still unread".into())
}
