//! A GPU model as the serving engine's forward pass: the engine allocates pages from its own
//! pool (no storage on the host) and the GPU pool holds the same pages.

use vortex_model::model::{ForwardError, ForwardPass, KvState, Model, Next, SeqStep, Wants};

use super::{GpuModel, PlacedStep};

/// The engine's forward passes on a GPU. Decode rows and prefill rows of one engine step run
/// as two passes: a pass with a prefill attends densely, and decode rows must run the flow.
pub struct CudaPass {
    pub gpu: GpuModel,
}

impl ForwardPass for CudaPass {
    fn forward(
        &mut self,
        model: &Model,
        kv: &mut KvState,
        batch: &mut [SeqStep],
        wants: &[Wants],
    ) -> Result<Vec<Next>, ForwardError> {
        if wants.len() != batch.len() {
            return Err(ForwardError::Backend(format!(
                "{} wants for {} sequences",
                wants.len(),
                batch.len()
            )));
        }
        if batch.iter().any(|s| s.state.flow != 0) {
            return Err(ForwardError::Attention(
                "on cuda the server runs its default flow only".into(),
            ));
        }
        let (needed, free) = model.check_batch(kv, batch)?;
        let backend = |e: crate::CudaError| {
            if e.is_fatal() {
                ForwardError::DeviceLost(e.to_string())
            } else {
                ForwardError::Backend(e.to_string())
            }
        };
        for s in batch.iter_mut() {
            // A request's first pass gives it a state slot if the flow keeps state (so does
            // a pass after the flow was replaced: the old slot's state is gone with it).
            if self.gpu.flow.keeps_state()
                && !s
                    .state
                    .slot
                    .as_ref()
                    .is_some_and(|x| self.gpu.flow.owns_slot(x))
            {
                s.state.slot = self.gpu.state_slot().map_err(backend)?;
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
        let (decode, prefill): (Vec<usize>, Vec<usize>) =
            (0..batch.len()).partition(|&i| batch[i].tokens.len() == 1);
        let mut out = vec![Next::Nothing; batch.len()];
        for group in [prefill, decode] {
            if group.is_empty() {
                continue;
            }
            let placed: Vec<PlacedStep> = group
                .iter()
                .map(|&i| PlacedStep {
                    seq: &*batch[i].seq,
                    tokens: batch[i].tokens,
                    settings: Some(batch[i].settings),
                    state: batch[i].state.slot.as_ref(),
                })
                .collect();
            self.gpu.forward_placed(&placed).map_err(backend)?;
            // Greedy rows and plain draws at a temperature take their token from the device;
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
            let picks: Vec<(usize, f32, u64)> = (0..group.len())
                .filter_map(|r| match wants[group[r]] {
                    Wants::Argmax => Some((r, 0.0, 0)),
                    Wants::Draw { temperature, seed } => Some((r, temperature, seed)),
                    _ => None,
                })
                .collect();
            for (p, id) in picks.iter().zip(self.gpu.draw(&picks).map_err(backend)?) {
                out[group[p.0]] = Next::Token(id);
            }
        }
        Ok(out)
    }

    fn per_request_flows(&self) -> bool {
        false
    }

    fn device(&self) -> String {
        format!("cuda:{}", self.gpu.dev.ordinal)
    }
}
