//! Long-context evaluation of sparse flows against dense attention on the same model: synthetic
//! retrieval tasks scored by exact match, attention-fidelity metrics, reports and plots.

pub mod fidelity;
pub mod plot;
pub mod recall_pass;
pub mod report;
pub mod rng;
pub mod runner;
pub mod score;
pub mod spec;
pub mod tasks;
pub mod text;
