//! Top-k per row on the GPU, one block per row over keys in shared memory: a histogram linear
//! in the values, then radix digits of the keys, refined until exact, or for the approximate
//! top-k only until its recall bound holds (the bound of the CPU's `topk_approx`). The device
//! code (`kernels/topk.cu`) is shared with the fused index phases.

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};

use crate::compile::{ModuleSpec, build};
use crate::error::driver;
use crate::{CudaError, Device};

/// The device code, for modules that compile it in front of their own.
pub const SOURCE: &str = include_str!("kernels/topk.cu");
/// Threads per row (`TOPK_THREADS` in the source).
pub const THREADS: u32 = 512;
/// The longest row: its keys fill the dynamic shared memory of one block.
pub const MAX_N: usize = 49_152;
// The kernel ranks kept keys with r k < MAX_N^2 in 32-bit arithmetic.
const _: () = assert!((MAX_N as u64).pow(2) < 1 << 32);

/// Of `k` kept, how many the approximate top-k guarantees in the exact top-k: as the CPU's
/// `topk_approx`, `ceil((1 - tolerance) k)`; `k` (exact) for `tolerance <= 0`.
pub fn required(k: usize, tolerance: f32) -> usize {
    if tolerance > 0.0 {
        let t = f64::from(tolerance.min(1.0));
        (((1.0 - t) * k as f64).ceil() as usize).min(k)
    } else {
        k
    }
}

/// Lets `f` take dynamic shared memory past the default 48 KiB: the longest row's keys, or what
/// the device's block limit leaves beside the kernel's own shared memory. Returns those bytes,
/// which launches check with [`check_shared`].
pub fn allow_longest_rows(dev: &Device, f: &CudaFunction) -> Result<u32, CudaError> {
    let own = f
        .shared_size_bytes()
        .map_err(driver("cuFuncGetAttribute"))?;
    let limit = (MAX_N * 4).min(dev.block_shared.saturating_sub(own.max(0) as usize));
    f.set_attribute(
        CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        limit as i32,
    )
    .map_err(driver("cuFuncSetAttribute"))?;
    Ok(limit as u32)
}

/// A launch's dynamic shared memory against what [`allow_longest_rows`] gave its kernel.
pub fn check_shared(bytes: u32, limit: u32) -> Result<(), CudaError> {
    if bytes > limit {
        return Err(CudaError::Unsupported(format!(
            "an index phase taking {bytes} bytes of shared memory for its longest row (this GPU \
             leaves the kernel {limit})"
        )));
    }
    Ok(())
}

/// Dynamic shared memory for rows of up to `n` keys.
pub fn shared_bytes(n: usize) -> Result<u32, CudaError> {
    if n > MAX_N {
        return Err(CudaError::Unsupported(format!(
            "top-k over {n} candidates (at most {MAX_N})"
        )));
    }
    Ok((n.max(1) * 4) as u32)
}

/// The stand-alone top-k kernel.
pub struct GpuTopk {
    rows_fn: CudaFunction,
    shared_limit: u32,
}

impl GpuTopk {
    pub fn new(dev: &Device) -> Result<Self, CudaError> {
        let built = build(dev, &module_spec())?;
        let rows_fn = built.function("topk_rows")?;
        let shared_limit = allow_longest_rows(dev, &rows_fn)?;
        Ok(Self {
            rows_fn,
            shared_limit,
        })
    }

    /// For each of `rows` rows of `n` scores, the indices of `min(k, n)` of them, ascending,
    /// into `out` (`rows * min(k, n)`): the exact top-k (ties to the lower index) when
    /// `tolerance <= 0`, else at least [`required`] of them in it. Returns `min(k, n)`.
    #[allow(clippy::too_many_arguments)]
    pub fn launch(
        &self,
        dev: &Device,
        scores: &CudaSlice<f32>,
        rows: usize,
        n: usize,
        k: usize,
        tolerance: f32,
        out: &mut CudaSlice<u32>,
    ) -> Result<usize, CudaError> {
        let k = k.min(n);
        if scores.len() < rows * n || out.len() < rows * k {
            return Err(CudaError::Invalid(
                "top-k buffers smaller than the rows".into(),
            ));
        }
        if rows == 0 || k == 0 {
            return Ok(k);
        }
        let bytes = shared_bytes(n)?;
        check_shared(bytes, self.shared_limit)?;
        let (n_i, k_i, req) = (n as i32, k as i32, required(k, tolerance) as i32);
        let mut l = dev.stream.launch_builder(&self.rows_fn);
        l.arg(scores).arg(&n_i).arg(&k_i).arg(&req).arg(out);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: bytes,
        };
        // SAFETY: argument types match the kernel; the buffers hold the rows checked above.
        unsafe { l.launch(cfg) }.map_err(driver("cuLaunchKernel(topk_rows)"))?;
        Ok(k)
    }
}

pub fn module_spec() -> ModuleSpec<'static> {
    ModuleSpec {
        name: "topk.cu",
        source: SOURCE,
        // Its rows are long: four keys per thread in flight in each pass.
        defines: vec![("TK_UNROLL", "4".to_string())],
    }
}

#[cfg(test)]
mod tests {
    use super::required;

    #[test]
    fn required_matches_the_cpu_bound() {
        assert_eq!(required(126, 0.0), 126);
        assert_eq!(required(126, -1.0), 126);
        assert_eq!(required(126, 0.03), 123);
        assert_eq!(required(100, 0.5), 50);
        assert_eq!(required(5, 1.0), 0);
    }
}
