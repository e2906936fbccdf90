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

/// Driver errors after which the context can run nothing more: every later call fails too.
const STICKY: [&str; 9] = [
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_LAUNCH_TIMEOUT",
    "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_ECC_UNCORRECTABLE",
];

impl CudaError {
    /// Whether the device context is lost: nothing on it can run until the process restarts.
    pub fn is_fatal(&self) -> bool {
        matches!(self, CudaError::Driver { detail, .. } if STICKY.iter().any(|s| detail.contains(s)))
    }
}

/// Maps a driver error of `call` into a [`CudaError`].
pub(crate) fn driver<E: fmt::Debug>(call: &'static str) -> impl Fn(E) -> CudaError {
    move |e| CudaError::Driver {
        call,
        detail: format!("{e:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::CudaError;

    #[test]
    fn sticky_driver_errors_are_fatal() {
        let driver = |detail: &str| CudaError::Driver {
            call: "launch",
            detail: detail.into(),
        };
        assert!(
            driver("DriverError(CUDA_ERROR_ILLEGAL_ADDRESS, \"an illegal memory access\")")
                .is_fatal()
        );
        assert!(!driver("DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")").is_fatal());
        assert!(!CudaError::Invalid("CUDA_ERROR_ILLEGAL_ADDRESS".into()).is_fatal());
    }
}
