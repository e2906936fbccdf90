//! Measured decode steps (`vortex serve --recall-every`): after each sparse layer's attention,
//! the exact attention mass of every page of each sparse row is compared with the pages the
//! layer's selection kept, on the device ([`PageMass`]), as the CPU's fidelity probe does; the
//! step's findings come back once it has run.

use cudarc::driver::CudaSlice;

use super::GpuModel;
use super::selection::Launch;
use crate::buf::Buf;
use crate::error::driver;
use crate::page_mass::{MassScratch, MeasuredRow, PageMass};
use crate::{CudaError, Device, DeviceTable, GpuLayerKv};

/// What one measured step found over its sparse rows: (layer, sequence, KV head) rows that
/// attended to some of their sequence's pages only.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepRecall {
    pub rows: usize,
    /// Sums over the rows of the exact attention mass on the kept pages (averaged over the
    /// group's query heads), and of the share of the top pages by mass that were kept.
    pub mass_sum: f64,
    pub topk_sum: f64,
    /// The lowest mass recall of a row (0 when no row was measured).
    pub lowest_mass: f64,
}

impl StepRecall {
    /// The step's rows, each its mass recall and top-k recall.
    fn of(pairs: &[f32]) -> Self {
        let mut s = Self::default();
        for (i, r) in pairs.chunks_exact(2).enumerate() {
            let (mass, topk) = (f64::from(r[0]), f64::from(r[1]));
            s.lowest_mass = if i == 0 {
                mass
            } else {
                s.lowest_mass.min(mass)
            };
            s.rows += 1;
            s.mass_sum += mass;
            s.topk_sum += topk;
        }
        s
    }
}

/// The measuring state of a model: armed for its next decode pass, then measuring it.
#[derive(Default)]
pub(super) struct RecallProbe {
    armed: bool,
    /// The pass being measured: rows measured so far (their two values each in `recall`), or
    /// why measuring stopped.
    pass: Option<Result<usize, CudaError>>,
    recall: Buf<f32>,
    kernels: Option<PageMass>,
    scratch: MassScratch,
}

impl RecallProbe {
    /// Whether the pass about to run is measured: it decodes and the probe was armed. It
    /// measures at most `rows` (layer, sequence, KV head) rows.
    pub fn begin(&mut self, dev: &Device, decode_only: bool, rows: usize) {
        self.pass = None;
        if decode_only && std::mem::take(&mut self.armed) {
            self.pass = Some(self.recall.ensure(dev, 2 * rows, false).map(|()| 0));
        }
    }

    pub fn measuring(&self) -> bool {
        self.pass.is_some()
    }

    /// Queues the measure of one layer's selection (`launches`' rows, written into `sparse`);
    /// a failure ends the pass's measuring, not the pass.
    #[allow(clippy::too_many_arguments)]
    pub fn layer(
        &mut self,
        dev: &Device,
        kv: &GpuLayerKv,
        dense: &DeviceTable,
        sparse: &DeviceTable,
        launches: &[Launch],
        q: &CudaSlice<f32>,
        scale: f32,
        group: usize,
    ) {
        let Some(Ok(done)) = self.pass else {
            return;
        };
        let rows: Vec<MeasuredRow> = launches
            .iter()
            .flat_map(|l| &l.rows)
            .filter(|r| r.dense == 0 && r.sinks + r.k + r.recent < r.pages)
            .map(|r| MeasuredRow {
                seq: r.seq as u32,
                head: r.head as u32,
                kept_at: r.out as u32,
                kept: (r.sinks + r.k + r.recent) as u32,
            })
            .collect();
        if rows.is_empty() {
            return;
        }
        let measured = (|| {
            let kernels = match &mut self.kernels {
                Some(k) => k,
                None => self
                    .kernels
                    .insert(PageMass::new(dev, kv.geom, kv.dtype, group)?),
            };
            let end = 2 * (done + rows.len());
            if end > self.recall.len() {
                return Err(CudaError::Invalid(
                    "a measured pass with more rows than it was sized for".into(),
                ));
            }
            let mut out = self.recall.slice_mut(2 * done..end);
            let sparse = &sparse.indices;
            let scratch = &mut self.scratch;
            kernels.measure(dev, kv, dense, q, scale, sparse, &rows, scratch, &mut out)?;
            Ok(done + rows.len())
        })();
        self.pass = Some(measured);
    }

    /// The measured pass's findings (waiting for it), once.
    pub fn take(&mut self, dev: &Device) -> Option<Result<StepRecall, CudaError>> {
        let rows = match self.pass.take()? {
            Ok(0) => return Some(Ok(StepRecall::default())),
            Ok(rows) => rows,
            Err(e) => return Some(Err(e)),
        };
        let pairs = dev
            .stream
            .clone_dtoh(&self.recall.slice(..2 * rows))
            .map_err(driver("cuMemcpyDtoH"));
        Some(pairs.map(|p| StepRecall::of(&p)))
    }
}

impl GpuModel {
    /// Builds the measuring kernels and takes their scratch memory now rather than at the
    /// first measured pass (before the KV pool fills the memory left); fails where this
    /// model's attention shape cannot be measured.
    pub fn prepare_recall(&mut self) -> Result<(), CudaError> {
        if self.recall.kernels.is_none() {
            let group = self.config.heads_q / self.geom.kv_heads;
            let k = PageMass::new(&self.dev, self.geom, self.kv_dtype, group)?;
            self.recall.kernels = Some(k);
        }
        self.recall.scratch.reserve(&self.dev)
    }

    /// Measures the next decode pass: each sparse layer's kept pages against exact attention
    /// over all of them ([`take_recall`](Self::take_recall) then says what it found). The
    /// measured pass launches kernel by kernel.
    pub fn measure_next_decode(&mut self) {
        self.recall.armed = true;
    }

    /// What the last measured pass found (`None` if no pass was measured since), or why it
    /// could not measure; waits for the pass.
    pub fn take_recall(&mut self) -> Option<Result<StepRecall, CudaError>> {
        self.recall.take(&self.dev)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_sums_its_rows_and_keeps_the_lowest_mass_recall() {
        let s = StepRecall::of(&[0.9, 1.0, 0.7, 0.5, 0.8, 0.75]);
        assert_eq!(s.rows, 3);
        assert!((s.mass_sum - 2.4).abs() < 1e-6);
        assert!((s.topk_sum - 2.25).abs() < 1e-6);
        assert!((s.lowest_mass - 0.7).abs() < 1e-6);
        assert_eq!(StepRecall::of(&[]), StepRecall::default());
    }
}
