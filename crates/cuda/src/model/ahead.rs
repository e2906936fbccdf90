//! Decoding ahead of the host: a pass's argmax tokens become the next decode pass's tokens on
//! the device, and come back to the host while that pass runs. The host's work for a step (page
//! tables, selection rows, plans) then overlaps the step before it on the device.

use cudarc::driver::{CudaEvent, PinnedHostSlice};

use vortex_model::sampling::DeviceDraw;

use super::{GpuModel, host_prefix};
use crate::CudaError;
use crate::error::driver;

#[derive(Default)]
pub(super) struct Ahead {
    /// Whether a forward pass is still to take the last pick.
    unread: bool,
    /// Rows of the last pick, its copy in page-locked memory and the event after that copy.
    rows: usize,
    host: Option<PinnedHostSlice<u32>>,
    landed: Option<CudaEvent>,
}

impl Drop for Ahead {
    /// The page-locked memory is freed only once the copy into it has landed.
    fn drop(&mut self) {
        if let Some(landed) = &self.landed {
            let _ = landed.synchronize();
        }
    }
}

impl GpuModel {
    /// Picks the most likely next token of each sequence of the last pass on the device, and
    /// has the next forward pass take them as its tokens: it must be a decode pass of as many
    /// sequences, in the same order, and the tokens it is given are not read. Nothing waits
    /// here; [`picked`](Self::picked) returns the tokens once they are back.
    pub fn argmax_ahead(&mut self) -> Result<(), CudaError> {
        let rows = self.queue_argmax()?;
        self.send_picks_back(rows)
    }

    /// As [`argmax_ahead`](Self::argmax_ahead), each sequence's token chosen as
    /// [`draw`](Self::draw) chooses it: one draw a sequence of the last pass, in its order.
    pub fn pick_ahead(&mut self, picks: &[DeviceDraw]) -> Result<(), CudaError> {
        if picks.len() != self.logit_rows {
            return Err(CudaError::Invalid(format!(
                "{} picks for a pass of {} sequences",
                picks.len(),
                self.logit_rows
            )));
        }
        let rows: Vec<(usize, DeviceDraw)> = picks.iter().copied().enumerate().collect();
        self.queue_draw(&rows)?;
        self.send_picks_back(rows.len())
    }

    /// Queues the copy of the first `rows` picked tokens back, and marks them for the next
    /// pass.
    fn send_picks_back(&mut self, rows: usize) -> Result<(), CudaError> {
        let dst = host_prefix(&self.dev, &mut self.ahead.host, rows)?;
        let s = &self.dev.stream;
        s.memcpy_dtoh(&self.scratch.next.slice(..rows), dst)
            .map_err(driver("cuMemcpyDtoH"))?;
        let a = &mut self.ahead;
        a.landed = Some(s.record_event(None).map_err(driver("cuEventRecord"))?);
        a.rows = rows;
        a.unread = true;
        Ok(())
    }

    /// The tokens of the last [`argmax_ahead`](Self::argmax_ahead) or
    /// [`pick_ahead`](Self::pick_ahead), waiting only for them (not for a pass queued since).
    /// A pass queued since has taken them; none queued later will.
    pub fn picked(&mut self) -> Result<Vec<u32>, CudaError> {
        let a = &mut self.ahead;
        let (Some(landed), Some(host)) = (&a.landed, &a.host) else {
            return Err(CudaError::Invalid("no tokens were picked ahead".into()));
        };
        landed.synchronize().map_err(driver("cuEventSynchronize"))?;
        let all = host.as_slice().map_err(driver("cuEventSynchronize"))?;
        let tokens = all[..a.rows].to_vec();
        a.unread = false;
        Ok(tokens)
    }

    /// No forward pass will take the last pick: the next one reads its own tokens.
    pub fn discard_picks(&mut self) {
        self.ahead.unread = false;
        self.discard_logprobs();
    }

    /// Whether the next forward pass will take tokens picked ahead.
    pub fn picks_pending(&self) -> bool {
        self.ahead.unread
    }

    /// Whether the coming pass of `seqs` sequences takes the picked tokens; an error where it
    /// cannot (checked before the pass changes anything).
    pub(super) fn takes_picks(&self, seqs: usize, decode_only: bool) -> Result<bool, CudaError> {
        let Ahead { unread, rows, .. } = self.ahead;
        match unread {
            false => Ok(false),
            true if rows == seqs && decode_only => Ok(true),
            true => Err(CudaError::Invalid(format!(
                "{rows} tokens were picked ahead for the next decode pass, which has {seqs} \
                 sequences{}",
                if decode_only {
                    ""
                } else {
                    " and is not a decode pass"
                }
            ))),
        }
    }

    /// The picked tokens as the pass's tokens (queued after the pass's own copy of them).
    pub(super) fn take_picks(&mut self, seqs: usize) -> Result<(), CudaError> {
        let sc = &mut self.scratch;
        self.dev
            .stream
            .memcpy_dtod(&sc.next.slice(..seqs), &mut sc.tokens.slice_mut(..seqs))
            .map_err(driver("cuMemcpyDtoD"))?;
        self.ahead.unread = false;
        Ok(())
    }
}
