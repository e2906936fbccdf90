//! The flow language: a sparse-attention algorithm as a short text program.
//!
//! A flow has a *cache phase* that summarises each completed KV page once (per KV head) into
//! declared page fields, and an *index phase* that, at every decode step, scores pages from the
//! query and those summaries and ends in a top-k. [`compile`] checks a flow against a model
//! geometry and lowers it to operator graphs; [`plan`] fuses them; [`exec`] runs them on CPU over
//! a batch; [`select`] turns scores into a sparse page table.

pub mod ast;
pub mod build;
pub mod check;
pub mod consts;
pub mod diag;
pub mod exec;
pub mod explain;
pub mod ir;
pub mod lexer;
pub mod library;
pub mod ops;
pub mod parser;
pub mod plan;
pub mod runner;
pub mod select;
pub mod settings;
pub mod state;

pub use check::compile;
pub use diag::{Diagnostic, FlowError, Span};
pub use ir::{Flow, Geometry};
pub use settings::Settings;
