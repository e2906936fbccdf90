//! Log-probabilities of the last pass's rows where the logits are: queued from the raw logits
//! before a mask or a draw, finished with the drawn tokens after it.

use super::GpuModel;
use crate::CudaError;
use crate::logprobs::{LogprobKernels, Logprobs, RowLogprobs};

impl GpuModel {
    /// Queues the log-sum-exp and the `top` best tokens of each of `rows` of the last pass's
    /// logits, as they are now (before [`mask_rows`](Self::mask_rows)).
    pub fn queue_logprobs(&mut self, rows: &[usize], top: usize) -> Result<(), CudaError> {
        self.check_ran()?;
        if let Some(r) = rows.iter().find(|&&r| r >= self.logit_rows) {
            return Err(CudaError::Invalid(format!(
                "log-probabilities of row {r}: a pass of {} sequences",
                self.logit_rows
            )));
        }
        if self.logprobs.is_none() {
            let k = LogprobKernels::new(&self.dev)?;
            self.logprobs = Some(Box::new((k, RowLogprobs::default())));
        }
        let (k, buf) = &mut **self.logprobs.as_mut().expect("set above");
        buf.queue(
            &self.dev,
            k,
            &self.scratch.logits,
            self.config.vocab,
            rows,
            top,
        )
    }

    /// The queued rows' log-probabilities after a [`draw`](Self::draw): row `j`'s token is the
    /// draw's pick `pick_of[j]`.
    pub fn finish_logprobs(&mut self, pick_of: &[usize]) -> Result<Vec<Logprobs>, CudaError> {
        let Some(lp) = self.logprobs.as_mut() else {
            return Err(CudaError::Invalid(
                "no log-probabilities were queued".into(),
            ));
        };
        let (k, buf) = &mut **lp;
        buf.finish(
            &self.dev,
            k,
            &self.scratch.logits,
            self.config.vocab,
            &self.scratch.next,
            pick_of,
        )
    }
}
