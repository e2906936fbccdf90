//! Captured decode passes: the last [`GRAPHS`] are kept by what they baked in and replayed when
//! a step repeats one; [`CapturePolicy`] says when a step that repeats none is captured.

use cudarc::driver::CudaGraph;

/// Captured decode passes kept at once: a batch whose sequences complete pages on different
/// steps, or whose budgets cross candidate buckets, goes back and forth between a few.
pub(super) const GRAPHS: usize = 8;

/// A captured decode pass and what it baked in.
pub(super) struct StepGraph {
    pub key: Vec<u64>,
    pub graph: CudaGraph,
}

// SAFETY: CUDA graph handles may be used from any thread as long as calls on one graph are
// serialized; the graph lives inside its model, which `&mut self` methods use from one thread
// at a time (the model moves to the serving engine's thread once, whole).
unsafe impl Send for StepGraph {}

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
