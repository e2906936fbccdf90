//! What a GPU model's last forward pass gives back: its logits, and tokens chosen on the
//! device (argmax, draws, under token masks), with only the ids copied back.

use cudarc::driver::{DeviceRepr, PinnedHostSlice, ValidAsZeroBits};
use rayon::prelude::*;
use vortex_model::sampling::DeviceDraw;

use super::GpuModel;
use crate::error::driver;
use crate::{CudaError, Device};

impl GpuModel {
    pub(super) fn check_ran(&self) -> Result<(), CudaError> {
        if self.logit_rows == 0 {
            return Err(CudaError::Invalid("no forward pass has run yet".into()));
        }
        Ok(())
    }

    /// The last forward pass's logits, one row per sequence.
    pub fn logits(&mut self) -> Result<Vec<Vec<f32>>, CudaError> {
        let rows: Vec<usize> = (0..self.logit_rows).collect();
        self.logits_of(&rows)
    }

    /// The logits of the last forward pass's sequences `rows` (indices into its batch): the
    /// span they lie in is copied at once into page-locked memory, then out to a vector a row.
    pub fn logits_of(&mut self, rows: &[usize]) -> Result<Vec<Vec<f32>>, CudaError> {
        self.check_ran()?;
        let v = self.config.vocab;
        if let Some(&r) = rows.iter().find(|&&r| r >= self.logit_rows) {
            return Err(CudaError::Invalid(format!(
                "row {r} of a pass of {} sequences",
                self.logit_rows
            )));
        }
        let (Some(&lo), Some(&hi)) = (rows.iter().min(), rows.iter().max()) else {
            return Ok(Vec::new());
        };
        let span = (hi + 1 - lo) * v;
        let dst = host_prefix(&self.dev, &mut self.host_logits, span)?;
        self.dev
            .stream
            .memcpy_dtoh(&self.scratch.logits.slice(lo * v..(hi + 1) * v), dst)
            .map_err(driver("cuMemcpyDtoH"))?;
        // The copy into page-locked memory is asynchronous, and this context does not track
        // events on host buffers: wait for the stream before reading.
        self.dev.synchronize()?;
        let host = self.host_logits.as_ref().expect("filled above");
        let all = host.as_slice().map_err(driver("cuEventSynchronize"))?;
        Ok(rows
            .par_iter()
            .map(|&r| all[(r - lo) * v..(r - lo + 1) * v].to_vec())
            .collect())
    }

    /// Tokens of the last forward pass's sequences chosen on the device, one for each
    /// `(row, draw)`: the argmax of the row's logits at temperature 0, else a draw from their
    /// softmax at that temperature over the tokens the draw's cuts keep (the Gumbel-max trick,
    /// noise hashed from the seed and the token id). Only the ids are copied back.
    pub fn draw(&mut self, picks: &[(usize, DeviceDraw)]) -> Result<Vec<u32>, CudaError> {
        self.queue_draw(picks)?;
        if picks.is_empty() {
            return Ok(Vec::new());
        }
        self.dev
            .stream
            .clone_dtoh(&self.scratch.next.slice(..picks.len()))
            .map_err(driver("cuMemcpyDtoH"))
    }

    /// Holds rows of the last forward pass's logits to token sets before a
    /// [`draw`](Self::draw): for each `(row, set)`, the logits of tokens outside the set (bit
    /// `id % 64` of word `id / 64`) become -inf.
    pub fn mask_rows(&mut self, masks: &[(usize, &[u64])]) -> Result<(), CudaError> {
        self.check_ran()?;
        if masks.is_empty() {
            return Ok(());
        }
        if let Some((r, _)) = masks.iter().find(|m| m.0 >= self.logit_rows) {
            return Err(CudaError::Invalid(format!(
                "mask of row {r}: a pass of {} sequences",
                self.logit_rows
            )));
        }
        let sc = &mut self.scratch;
        sc.masks.load(&self.dev, self.config.vocab, masks)?;
        self.sampling.mask(
            &self.dev,
            &mut sc.logits,
            self.logit_rows,
            self.config.vocab,
            &sc.masks,
        )
    }

    /// Queues [`draw`](Self::draw)'s tokens into `scratch.next`, one a pick in order.
    pub(super) fn queue_draw(&mut self, picks: &[(usize, DeviceDraw)]) -> Result<(), CudaError> {
        self.check_ran()?;
        if let Some((r, _)) = picks.iter().find(|p| p.0 >= self.logit_rows) {
            return Err(CudaError::Invalid(format!(
                "draw from row {r}: a pass of {} sequences",
                self.logit_rows
            )));
        }
        let sc = &mut self.scratch;
        sc.draws.load(&self.dev, picks)?;
        // A draw may pick more tokens than the pass has rows (several seeds from one row).
        sc.next.ensure(&self.dev, picks.len(), false)?;
        self.sampling.draw(
            &self.dev,
            &sc.logits,
            self.logit_rows,
            self.config.vocab,
            &sc.draws,
            &mut sc.next,
        )
    }

    /// The most likely next token of each sequence of the last forward pass, chosen on the
    /// device (only the token ids are copied back).
    pub fn argmax(&mut self) -> Result<Vec<u32>, CudaError> {
        let rows = self.queue_argmax()?;
        self.dev
            .stream
            .clone_dtoh(&self.scratch.next.slice(..rows))
            .map_err(driver("cuMemcpyDtoH"))
    }

    /// Queues the argmax of each row of the last pass's logits into `scratch.next`; returns
    /// the rows.
    pub(super) fn queue_argmax(&mut self) -> Result<usize, CudaError> {
        self.check_ran()?;
        let sc = &mut self.scratch;
        self.sampling.argmax(
            &self.dev,
            &sc.logits,
            self.logit_rows,
            self.config.vocab,
            &mut sc.next,
        )?;
        Ok(self.logit_rows)
    }
}

/// The first `n` values of the page-locked buffer in `slot`, reallocated where it holds fewer,
/// as a device-to-host copy's destination: such a copy fills its whole destination, so it gets
/// exactly `n` values, not the buffer's largest size so far.
pub(super) fn host_prefix<'a, T: DeviceRepr + ValidAsZeroBits>(
    dev: &Device,
    slot: &'a mut Option<PinnedHostSlice<T>>,
    n: usize,
) -> Result<&'a mut [T], CudaError> {
    if slot.as_ref().is_none_or(|h| h.len() < n) {
        *slot = None;
        // SAFETY: the caller's copy writes the values before anything reads them; flags 0
        // keep the memory cached for the host's reads (write-combined memory reads slowly).
        let h = unsafe { dev.ctx.alloc_pinned_with_flags::<T>(n, 0) }
            .map_err(driver("cuMemHostAlloc"))?;
        *slot = Some(h);
    }
    let host = slot.as_mut().expect("allocated above");
    Ok(&mut host.as_mut_slice().map_err(driver("cuEventSynchronize"))?[..n])
}
