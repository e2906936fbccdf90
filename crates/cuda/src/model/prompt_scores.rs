//! Log-probabilities of prompt rows (`prompt_logprobs`): the final norm and the output
//! projection of chosen rows of the last pass, a block of rows at a time, then each row's next
//! prompt token's log-probability and its best tokens where the logits are. Only those numbers
//! come back, not the rows' logits.

use half::bf16;

use super::GpuModel;
use super::logprobs::kernels;
use crate::CudaError;
use crate::blas::Blas;
use crate::buf::Buf;
use crate::logprobs::{Logprobs, RowLogprobs};

/// Rows whose logits are held at once: 64 rows of a 151,936-token vocabulary take 39 MB, and
/// the output projection's weights are read once a block.
const BLOCK_ROWS: usize = 64;

/// The device buffers of prompt rows' scores, allocated at the first request for them.
#[derive(Default)]
pub(super) struct PromptScores {
    rows: Buf<i32>,
    next: Buf<u32>,
    normed: Buf<bf16>,
    logits: Buf<f32>,
    logprobs: RowLogprobs,
}

impl GpuModel {
    /// The log-probabilities of the last pass's token rows `rows` (in its order, a sequence's
    /// new tokens one after another), row `rows[j]` followed by token `next[j]`: that token's
    /// and the `top` most likely tokens', as the model gives them.
    pub fn score_rows(
        &mut self,
        rows: &[usize],
        next: &[u32],
        top: usize,
    ) -> Result<Vec<Logprobs>, CudaError> {
        if rows.len() != next.len() {
            return Err(CudaError::Invalid(format!(
                "{} rows scored against {} tokens",
                rows.len(),
                next.len()
            )));
        }
        if let Some(r) = rows.iter().find(|&&r| r >= self.pass_rows) {
            return Err(CudaError::Invalid(format!(
                "prompt row {r} of a pass of {} rows",
                self.pass_rows
            )));
        }
        let vocab = self.config.vocab;
        if let Some(t) = next.iter().find(|&&t| t as usize >= vocab) {
            return Err(CudaError::Invalid(format!(
                "token id {t} is outside the vocabulary of {vocab}"
            )));
        }
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let dev = &self.dev;
        let k = &kernels(&mut self.logprobs, dev)?.0;
        let s = &mut self.prompt_scores;
        let head = self.weights.head();
        s.normed
            .ensure(dev, BLOCK_ROWS * self.config.hidden, false)?;
        s.logits.ensure(dev, BLOCK_ROWS * vocab, false)?;
        let mut out = Vec::with_capacity(rows.len());
        for (rows, next) in rows.chunks(BLOCK_ROWS).zip(next.chunks(BLOCK_ROWS)) {
            let n = rows.len();
            let ids: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
            s.rows.load(dev, &ids)?;
            s.next.load(dev, next)?;
            let input = Blas::input_for(n, head);
            self.layer_kernels.rms_norm(
                dev,
                &self.scratch.x,
                Some(&s.rows),
                n,
                &self.weights.norm,
                self.config.rms_eps,
                &mut s.normed,
                input,
            )?;
            self.blas
                .matmul(dev, &s.normed, input, n, head, &mut s.logits, false)?;
            // Row j's token is next[j].
            let block: Vec<usize> = (0..n).collect();
            s.logprobs.queue(dev, k, &s.logits, vocab, &block, top)?;
            out.extend(
                s.logprobs
                    .finish(dev, k, &s.logits, vocab, &s.next, &block)?,
            );
        }
        Ok(out)
    }
}
