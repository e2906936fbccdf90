//! Captured decode passes: the last [`GRAPHS`] are kept by what they baked in (the key) and
//! replayed when a step repeats one; [`CapturePolicy`] says when a step that repeats none is
//! captured.

use cudarc::driver::CudaGraph;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};

use super::GpuModel;
use super::forward::Pass;
use crate::error::driver;
use crate::{CudaError, DeviceTable};

/// Captured decode passes kept at once: a batch whose sequences complete pages on different
/// steps, or whose budgets cross candidate buckets, goes back and forth between a few.
const GRAPHS: usize = 8;

/// A captured decode pass and what it baked in.
pub(super) struct StepGraph {
    key: Vec<u64>,
    graph: CudaGraph,
}

// SAFETY: CUDA graph handles may be used from any thread as long as calls on one graph are
// serialized; the graph lives inside its model, which `&mut self` methods use from one thread
// at a time (the model moves to the serving engine's thread once, whole).
unsafe impl Send for StepGraph {}

impl GpuModel {
    /// Runs the pass's kernels: replayed from a graph when a decode step repeats one of the
    /// last [`GRAPHS`] captured, captured when it does not (as the capture policy allows),
    /// launched one by one otherwise.
    pub(super) fn launch(&mut self, dense: &DeviceTable, pass: &Pass) -> Result<(), CudaError> {
        let graphable = self.use_graphs
            && pass.decode_only
            && self.profiler.is_none()
            && !self.recall.measuring();
        if !graphable {
            return self.launch_kernels(dense, pass);
        }
        let key = self.graph_key(dense, pass);
        if let Some(i) = self.graphs.iter().position(|g| g.key == key) {
            // Most recently used last.
            let g = self.graphs.remove(i);
            self.graphs.push(g);
            self.capture.hit();
        } else if !self.capture.capture() {
            return self.launch_kernels(dense, pass);
        } else {
            let s = &self.dev.stream;
            s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
                .map_err(driver("cuStreamBeginCapture"))?;
            let launched = self.launch_kernels(dense, pass);
            let captured = self
                .dev
                .stream
                .end_capture(CUgraphInstantiate_flags(0))
                .map_err(driver("cuStreamEndCapture"));
            let graph = match (launched, captured) {
                (Ok(()), Ok(Some(graph))) => graph,
                (Ok(()), Ok(None)) => {
                    return Err(CudaError::Invalid("graph capture recorded nothing".into()));
                }
                // A capture is void when anything in the process synchronizes the device
                // meanwhile (another model freeing memory, say): the step then runs kernel by
                // kernel, and a real fault shows there.
                _ => return self.launch_kernels(dense, pass),
            };
            if self.graphs.len() == GRAPHS {
                self.graphs.remove(0);
            }
            self.graphs.push(StepGraph { key, graph });
            self.graphs_captured += 1;
        }
        let g = self.graphs.last().expect("found or captured above");
        g.graph.launch().map_err(driver("cuGraphLaunch"))
    }

    /// Everything a captured pass bakes in: shapes, plan sizes and buffer addresses.
    fn graph_key(&self, dense: &DeviceTable, pass: &Pass) -> Vec<u64> {
        let dev = &self.dev;
        let mut key = vec![
            pass.n as u64,
            pass.seqs as u64,
            self.generation,
            self.active_selections as u64,
        ];
        let flows: Vec<_> = std::iter::once(&self.flow)
            .chain(self.others.iter().map(|o| &o.gpu))
            .collect();
        for flow in &flows {
            key.extend(flow.addresses(dev));
        }
        key.extend(pass.sparse.iter().map(|s| s.map_or(0, |i| i as u64 + 1)));
        for sel in &self.selections[..self.active_selections] {
            key.extend(sel.key(dev, &flows));
        }
        key.extend(self.scratch.completed.identity(dev));
        key.extend(dense.addresses(dev));
        // The dense plan changes as sequences grow; it counts only where a layer uses it (a
        // sliding-window layer attends through the window table instead).
        let cfg = &self.config;
        let dense_layer = |(l, s): (usize, &Option<usize>)| s.is_none() && cfg.window(l).is_none();
        if pass.sparse.iter().enumerate().any(dense_layer) {
            key.extend(self.dense_attn.launch_identity(dev));
        }
        if let (Some(t), Some(a)) = (&self.window_table, &self.window_attn) {
            key.extend(t.addresses(dev));
            key.extend(a.launch_identity(dev));
        }
        key.extend(self.scratch.addresses(dev));
        key
    }
}

/// Steps in a row that may each capture a new graph before capturing pauses.
const MISSES: u32 = 3;
/// Steps that then launch kernel by kernel unless one repeats a kept graph.
const PAUSE: u32 = 32;

/// Whether to capture a decode step that repeats no kept graph. A capture costs milliseconds of
/// host time, repaid only when later steps replay it: where every step's launches differ from
/// the last ones (a launch that bakes in something each step changes), capturing pauses after
/// [`MISSES`] such steps in a row for [`PAUSE`] steps, then tries once more.
#[derive(Default)]
pub(super) struct CapturePolicy {
    misses: u32,
    paused: u32,
}

impl CapturePolicy {
    /// A step replays a kept graph.
    pub fn hit(&mut self) {
        *self = Self::default();
    }

    /// A step repeats no kept graph: whether to capture it.
    pub fn capture(&mut self) -> bool {
        if self.paused > 0 {
            self.paused -= 1;
            return false;
        }
        if self.misses == MISSES {
            // One try after a pause; a miss right after it pauses again.
            self.misses = MISSES - 1;
            self.paused = PAUSE - 1;
            return false;
        }
        self.misses += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which of `steps` steps, each repeating no kept graph, capture.
    fn captures(p: &mut CapturePolicy, steps: usize) -> Vec<usize> {
        (0..steps).filter(|_| p.capture()).collect()
    }

    #[test]
    fn steps_that_never_repeat_pause_capturing() {
        let mut p = CapturePolicy::default();
        let period = PAUSE as usize + 1;
        let want: Vec<usize> = [0, 1, 2]
            .into_iter()
            .chain((1..4).map(|i| 2 + i * period))
            .collect();
        assert_eq!(captures(&mut p, 3 + 3 * period), want);
    }

    #[test]
    fn a_replayed_step_ends_the_pause() {
        let mut p = CapturePolicy::default();
        assert_eq!(captures(&mut p, 5), [0, 1, 2]);
        p.hit();
        assert_eq!(captures(&mut p, 4), [0, 1, 2]);
        // Misses between replayed steps capture every time.
        for _ in 0..10 {
            p.hit();
            assert!(p.capture());
        }
    }
}
