//! Log-probabilities of the last pass's rows where the logits are: queued from the raw logits
//! before a mask or a draw, finished with the drawn tokens after it, and, for tokens picked
//! ahead of the host, copied back beside them.

use cudarc::driver::{CudaEvent, PinnedHostSlice};

use super::{GpuModel, host_prefix};
use crate::error::driver;
use crate::logprobs::{LogprobKernels, Logprobs, RowLogprobs, assemble};
use crate::{CudaError, Device};

/// Log-probabilities of tokens picked ahead, on their way back.
#[derive(Default)]
pub(super) struct LogprobsBack {
    /// The pass's rows they are for, and how many best tokens each; `None`: nothing in flight.
    rows: Option<(Vec<usize>, usize)>,
    chosen: Option<PinnedHostSlice<f32>>,
    ids: Option<PinnedHostSlice<u32>>,
    lps: Option<PinnedHostSlice<f32>>,
    landed: Option<CudaEvent>,
}

impl Drop for LogprobsBack {
    /// The page-locked memory is freed only once the copies into it have landed.
    fn drop(&mut self) {
        if let Some(landed) = &self.landed {
            let _ = landed.synchronize();
        }
    }
}

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
        let (k, buf) = kernels(&mut self.logprobs, &self.dev)?;
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

    /// After [`pick_ahead`](Self::pick_ahead): the queued rows' log-probabilities (`rows`, as
    /// [`queue_logprobs`](Self::queue_logprobs) took them; a pick a row), copied back with the
    /// picks, for [`logprobs_back`](Self::logprobs_back).
    pub fn send_logprobs_back(&mut self, rows: &[usize]) -> Result<(), CudaError> {
        let Some(lp) = self.logprobs.as_mut() else {
            return Err(CudaError::Invalid(
                "no log-probabilities were queued".into(),
            ));
        };
        let (k, buf) = &mut **lp;
        buf.queue_chosen(
            &self.dev,
            k,
            &self.scratch.logits,
            self.config.vocab,
            &self.scratch.next,
            rows,
        )?;
        let (n, top) = buf.shape();
        let (chosen, ids, lps) = buf.outputs();
        let back = &mut self.logprobs_in_flight;
        // Copies sent before (and discarded) must land before their memory is reused or freed.
        if let Some(landed) = back.landed.take() {
            landed.synchronize().map_err(driver("cuEventSynchronize"))?;
        }
        let s = &self.dev.stream;
        let copy = |e| driver("cuMemcpyDtoH")(e);
        s.memcpy_dtoh(
            &chosen,
            host_prefix(&self.dev, &mut back.chosen, chosen.len())?,
        )
        .map_err(copy)?;
        s.memcpy_dtoh(&ids, host_prefix(&self.dev, &mut back.ids, ids.len())?)
            .map_err(copy)?;
        s.memcpy_dtoh(&lps, host_prefix(&self.dev, &mut back.lps, lps.len())?)
            .map_err(copy)?;
        back.landed = Some(s.record_event(None).map_err(driver("cuEventRecord"))?);
        back.rows = Some((rows.to_vec(), top));
        debug_assert_eq!(n, rows.len());
        Ok(())
    }

    /// The log-probabilities [`send_logprobs_back`](Self::send_logprobs_back) sent since the
    /// last call, each with its row, once they are back; `None` if none were sent.
    pub fn logprobs_back(&mut self) -> Result<Option<Vec<(usize, Logprobs)>>, CudaError> {
        let back = &mut self.logprobs_in_flight;
        let Some((rows, top)) = back.rows.take() else {
            return Ok(None);
        };
        if let Some(landed) = &back.landed {
            landed.synchronize().map_err(driver("cuEventSynchronize"))?;
        }
        let n = rows.len();
        let lps = assemble(
            read(&back.chosen)?,
            read(&back.ids)?,
            read(&back.lps)?,
            n,
            top,
        );
        Ok(Some(rows.into_iter().zip(lps).collect()))
    }

    /// No pass will take the log-probabilities in flight.
    pub(super) fn discard_logprobs(&mut self) {
        self.logprobs_in_flight.rows = None;
    }
}

/// The values of page-locked memory a copy has filled.
fn read<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    h: &Option<PinnedHostSlice<T>>,
) -> Result<&[T], CudaError> {
    match h {
        Some(h) => h.as_slice().map_err(driver("cuEventSynchronize")),
        None => Err(CudaError::Invalid(
            "no log-probabilities were sent back".into(),
        )),
    }
}

/// The log-probabilities' kernels, compiled at the first use, and the buffers of a pass's rows.
pub(super) fn kernels<'a>(
    lp: &'a mut Option<Box<(LogprobKernels, RowLogprobs)>>,
    dev: &Device,
) -> Result<&'a mut (LogprobKernels, RowLogprobs), CudaError> {
    if lp.is_none() {
        *lp = Some(Box::new((
            LogprobKernels::new(dev)?,
            RowLogprobs::default(),
        )));
    }
    Ok(lp.as_mut().expect("set above"))
}
