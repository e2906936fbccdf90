//! The serving engine: one scheduler loop over a continuously batched set of requests, with
//! chunked prefill, prefix caching, preemption and per-request flows.

mod active;
pub mod engine;
pub mod handle;
pub mod metrics;
pub mod prefix_cache;
pub mod request;
pub mod scheduler;

pub use engine::{Engine, EngineConfig};
pub use handle::{EngineHandle, EngineStopped};
pub use metrics::Metrics;
pub use request::{Event, FinishReason, FlowChoice, RequestSpec, TokenLogprob, Usage};
pub use scheduler::StepBudget;
