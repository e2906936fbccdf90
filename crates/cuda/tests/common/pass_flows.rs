//! Flows whose index phase runs in passes on the GPU: reductions and a softmax over pages in
//! four stages, and state of two fields (BENCHMARKS.md times these two too); fp8 fields staged
//! in shared memory, and read value by value; a score that is the state before the step;
//! six page fields of four types, and five states beside an f16 field (one kernel parameter a
//! field); each reduction over a head's dims in one pass; the larger and smaller of products by
//! the query; sums of products by the query on the tensor cores, and four of them beside a step
//! value too large for their shared memory; a cache phase too large for a warp's shared memory.

pub const SPREAD: &str = include_str!("../flows/spread.flow");
pub const DECAY: &str = include_str!("../flows/decay.flow");
pub const HALVES_FP8: &str = include_str!("../flows/halves_fp8.flow");
pub const SIX_FP8: &str = include_str!("../flows/six_fp8.flow");
pub const PREVIOUS: &str = include_str!("../flows/previous.flow");
pub const WIDE: &str = include_str!("../flows/wide.flow");
pub const REDUCTIONS: &str = include_str!("../flows/reductions.flow");
pub const PRODUCTS: &str = include_str!("../flows/products.flow");
pub const SUMS: &str = include_str!("../flows/sums.flow");
pub const CROWDED: &str = include_str!("../flows/crowded.flow");
pub const FIVE_STATES: &str = include_str!("../flows/five_states.flow");
pub const THREAD_CACHE: &str = include_str!("../flows/thread_cache.flow");
