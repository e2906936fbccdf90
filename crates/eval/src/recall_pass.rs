//! A server's measured recall (`vortex serve --recall-every N`): the CPU model as the engine's
//! forward pass, which in one decode pass of every `N` compares each layer's selection with
//! exact attention over the same KV (as `vortex eval` does) and reports what it measured.

use vortex_model::model::{
    CpuPass, ForwardError, ForwardPass, KvState, Model, Next, PromptRows, Scored, SeqStep, Wants,
};

use crate::fidelity::{Fidelity, FidelityProbe};

/// What a measured pass reports: the fidelity of its sparse rows, every layer's.
pub type Report = Box<dyn FnMut(&Fidelity) + Send>;

pub struct RecallPass {
    every: u64,
    decode_passes: u64,
    report: Report,
}

impl RecallPass {
    /// Measures one pass with decode rows in every `every` (at least 1).
    pub fn new(every: u64, report: Report) -> Self {
        Self {
            every: every.max(1),
            decode_passes: 0,
            report,
        }
    }
}

impl ForwardPass for RecallPass {
    fn forward(
        &mut self,
        model: &Model,
        kv: &mut KvState,
        batch: &mut [SeqStep],
        wants: &[Wants],
    ) -> Result<Vec<Next>, ForwardError> {
        let decodes = batch.iter().any(|s| s.tokens.len() == 1);
        if decodes {
            self.decode_passes += 1;
        }
        if !(decodes && self.decode_passes.is_multiple_of(self.every)) {
            return CpuPass.forward(model, kv, batch, wants);
        }
        let mut probe = FidelityProbe::new(1);
        probe.sparse_only = true;
        let logits = model.forward_observed(kv, batch, &mut probe)?;
        if probe.fidelity.rows > 0 {
            (self.report)(&probe.fidelity);
        }
        Ok(logits.into_iter().map(Next::Logits).collect())
    }

    fn scores_prompts(&self) -> bool {
        true
    }

    /// Passes that score prompt rows go unmeasured and count toward none of the `every`.
    fn forward_scoring(
        &mut self,
        model: &Model,
        kv: &mut KvState,
        batch: &mut [SeqStep],
        wants: &[Wants],
        scored: &[PromptRows],
    ) -> Result<Scored, ForwardError> {
        CpuPass.forward_scoring(model, kv, batch, wants, scored)
    }
}
