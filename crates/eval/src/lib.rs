//! Long-context evaluation tasks and attention-fidelity metrics for sparse flows.
