//! The CUDA backend, chosen at run time; kernels are compiled with NVRTC on the device.
//!
//! Nothing here links against CUDA: the driver and NVRTC are opened when a [`Device`] is first
//! opened, and a machine without them gets [`CudaError::Unavailable`].
//!
//! - [`compile`]: NVRTC compilation for the device's architecture, cached on disk by hash.
//! - [`kv_pool`]: the paged KV pool on the device (bf16 or fp8 e4m3) and its append kernel.
//! - [`table`]: CSR page tables on the device.
//! - [`page_list`]: the pages a step completed, listed on the device for the cache phase.
//! - [`page_mass`]: exact attention mass per page, which measured steps compare selections with.
//! - [`plan`]: the per-step planner that cuts (sequence, KV head, pages) work into chunks.
//! - [`launch`]: launches that may start while the previous kernel drains.
//! - [`attention`]: paged grouped-query decode attention with the split merge.
//! - [`topk`]: top-k per row, exact and approximate with a recall bound.
//! - [`block_topk`]: the fused index phase of block top-k and Quest (page scores from the
//!   summaries, top-k, sparse table) in one kernel; its tensor-core scorer of centroids and
//!   fp8 envelopes (`kernels/scores.cu`) is shared with h2o.
//! - [`h2o`]: the index phase of H2O-style heavy hitters, with each request's accumulated
//!   attention mass in a state slot on the device.
//! - [`codegen`], [`generated`]: every other flow's cache and index phases as CUDA generated
//!   from its checked graph.
//! - [`double_sparse`]: the built-in double_sparse's index phase on the tensor cores, in place
//!   of its generated one.
//! - [`blas`]: matrix products with f32 accumulation: bf16 weights through cuBLAS, fp8 ones
//!   through [`fp8_weights`] (a decode step's rows on the tensor cores).
//! - [`layer_kernels`]: embedding, RMSNorm, the q/k/v epilogue (QK-norm, RoPE, KV append),
//!   SwiGLU.
//! - [`sampling`]: the next tokens chosen where the logits are (argmax, or draws with top-k,
//!   top-p and min-p).
//! - [`step_attention`]: which build of the attention kernel a model step uses.
//! - [`prefill`]: dense causal prefill attention over the paged pool.
//! - [`model`]: a whole decoder on the GPU, with real or random weights.

pub mod attention;
pub mod blas;
pub mod block_topk;
pub mod buf;
pub mod codegen;
pub mod compile;
pub mod device;
pub mod double_sparse;
pub mod error;
pub mod flow_state;
pub mod fp8_weights;
pub mod generated;
pub mod h2o;
pub mod index_row;
pub mod kv_pool;
pub mod launch;
pub mod layer_kernels;
pub mod libs;
pub mod logprobs;
pub mod model;
pub mod page_list;
pub mod page_mass;
pub mod plan;
pub mod prefill;
pub mod prefill_shape;
pub mod sampling;
pub mod step_attention;
pub mod table;
pub mod timing;
pub mod topk;
pub mod upload;

/// The warp-wide tensor-core products (`kernels/mma.cu`), compiled in front of the kernels that
/// use them: the index scorers and the decode attention's page loop.
pub(crate) const MMA: &str = include_str!("kernels/mma.cu");
/// A page's keys and a query as the operands of tensor-core scores (`kernels/mma_keys.cu`),
/// compiled after [`MMA`] by the decode attention and the page masses.
pub(crate) const MMA_KEYS: &str = include_str!("kernels/mma_keys.cu");

pub use attention::DecodeAttention;
/// Device buffers, as the backend's API hands them out.
pub use cudarc::driver::CudaSlice;
pub use device::Device;
pub use error::CudaError;
pub use kv_pool::{GpuLayerKv, KvKernels, PoolDtype};
pub use table::DeviceTable;
/// e4m3 rounding on the host, as the pool kernels round.
pub use vortex_kv::fp8;

/// The device address of a buffer.
pub fn address<T>(dev: &Device, buf: &CudaSlice<T>) -> u64 {
    use cudarc::driver::DevicePtr;
    buf.device_ptr(&dev.stream).0
}
