//! Where a forward pass's device time goes: events recorded between its stages, summed per
//! stage. Off unless asked for; the events cost a record call each.

use cudarc::driver::CudaEvent;
use cudarc::driver::sys::CUevent_flags;

use crate::error::driver;
use crate::{CudaError, Device};

/// The stages of a forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Start,
    /// cuBLAS products: q|k|v, o, gate|up, down and the output projection.
    Matmul,
    /// Embedding, norms, the q/k/v epilogue with the KV append, SwiGLU, conversions.
    Elementwise,
    /// The flow's cache phase over completed pages.
    Cache,
    /// The flow's index phase (scores, top-k, sparse table).
    Index,
    Attention,
}

pub const STAGES: [Stage; 5] = [
    Stage::Matmul,
    Stage::Elementwise,
    Stage::Cache,
    Stage::Index,
    Stage::Attention,
];

impl Stage {
    pub fn name(self) -> &'static str {
        match self {
            Stage::Start => "start",
            Stage::Matmul => "matmul",
            Stage::Elementwise => "elementwise",
            Stage::Cache => "cache",
            Stage::Index => "index",
            Stage::Attention => "attention",
        }
    }
}

/// Events of one pass, each closing the stage named with it.
#[derive(Default)]
pub struct Profiler {
    marks: Vec<(Stage, CudaEvent)>,
}

impl Profiler {
    /// Records that the work queued since the last mark belongs to `stage`.
    pub fn mark(&mut self, dev: &Device, stage: Stage) -> Result<(), CudaError> {
        let e = dev
            .ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver("cuEventCreate"))?;
        e.record(&dev.stream).map_err(driver("cuEventRecord"))?;
        self.marks.push((stage, e));
        Ok(())
    }

    /// Milliseconds per stage (in [`STAGES`] order) of the marks so far; clears them.
    pub fn take(&mut self, dev: &Device) -> Result<Vec<(Stage, f64)>, CudaError> {
        dev.synchronize()?;
        let mut out: Vec<(Stage, f64)> = STAGES.iter().map(|&s| (s, 0.0)).collect();
        for w in self.marks.windows(2) {
            let ms = w[0]
                .1
                .elapsed_ms(&w[1].1)
                .map_err(driver("cuEventElapsedTime"))?;
            if let Some(slot) = out.iter_mut().find(|(s, _)| *s == w[1].0) {
                slot.1 += f64::from(ms);
            }
        }
        self.marks.clear();
        Ok(out)
    }
}
