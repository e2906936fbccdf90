use std::fmt;

/// Everything the CUDA backend can fail with. CUDA missing on the machine is an ordinary value
/// ([`CudaError::Unavailable`]), so callers can say so and fall back or exit cleanly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CudaError {
    /// No usable driver, runtime compiler or device.
    Unavailable(String),
    /// A driver call failed.
    Driver { call: &'static str, detail: String },
    /// NVRTC rejected a kernel source.
    Compile { kernel: String, log: String },
    /// The geometry has no kernel variant (e.g. a head width the kernels do not handle).
    Unsupported(String),
    /// Arguments that contradict each other (shapes, page tables).
    Invalid(String),
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaError::Unavailable(why) => write!(f, "CUDA is unavailable: {why}"),
            CudaError::Driver { call, detail } => {
                write!(f, "CUDA driver call {call} failed: {detail}")
            }
            CudaError::Compile { kernel, log } => {
                write!(f, "NVRTC could not compile {kernel}:\n{log}")
            }
            CudaError::Unsupported(what) => write!(f, "not supported on CUDA: {what}"),
            CudaError::Invalid(what) => write!(f, "{what}"),
        }
    }
}

impl std::error::Error for CudaError {}

/// Maps a driver error of `call` into a [`CudaError`].
pub(crate) fn driver<E: fmt::Debug>(call: &'static str) -> impl Fn(E) -> CudaError {
    move |e| CudaError::Driver {
        call,
        detail: format!("{e:?}"),
    }
}
