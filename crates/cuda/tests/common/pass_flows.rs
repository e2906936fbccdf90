//! Flows whose index phase runs in passes on the GPU: reductions and a softmax over pages in
//! four stages, and state of two fields. BENCHMARKS.md times them too.

pub const SPREAD: &str = include_str!("../flows/spread.flow");
pub const DECAY: &str = include_str!("../flows/decay.flow");
