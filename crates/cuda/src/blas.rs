//! Matrix products through cuBLAS: bf16 weights and activations, f32 accumulation and output.

use std::ffi::c_void;

use cudarc::cublas::CudaBlas;
use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t,
};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use half::bf16;

use crate::error::driver;
use crate::{CudaError, Device, libs};

/// A cuBLAS handle on the device's stream.
pub struct Blas {
    handle: CudaBlas,
}

/// A `rows x cols` bf16 matrix on the device, row-major (`rows` outputs, `cols` inputs).
pub struct GpuMatrix {
    pub data: CudaSlice<bf16>,
    pub rows: usize,
    pub cols: usize,
}

impl GpuMatrix {
    pub fn bytes(&self) -> usize {
        self.rows * self.cols * 2
    }
}

impl Blas {
    pub fn new(dev: &Device) -> Result<Self, CudaError> {
        libs::load_cublas()?;
        let handle = CudaBlas::new(dev.stream.clone()).map_err(driver("cublasCreate"))?;
        Ok(Self { handle })
    }

    /// `out[n, w.rows] = x[n, w.cols] · wᵀ`, plus what `out` held when `accumulate` is set
    /// (the residual add of a layer, fused into the product).
    pub fn matmul(
        &self,
        dev: &Device,
        x: &CudaSlice<bf16>,
        n: usize,
        w: &GpuMatrix,
        out: &mut CudaSlice<f32>,
        accumulate: bool,
    ) -> Result<(), CudaError> {
        if x.len() < n * w.cols || out.len() < n * w.rows || w.data.len() < w.rows * w.cols {
            return Err(CudaError::Invalid(format!(
                "matmul [{n} x {}] by [{} x {}]ᵀ: buffers of {}, {} and {} elements",
                w.cols,
                w.rows,
                w.cols,
                x.len(),
                w.data.len(),
                out.len()
            )));
        }
        if n == 0 {
            return Ok(());
        }
        let dims = [n, w.rows, w.cols];
        if dims.iter().any(|&d| d > i32::MAX as usize) {
            return Err(CudaError::Unsupported(format!(
                "matmul dimensions {dims:?}"
            )));
        }
        let (alpha, beta) = (1.0f32, if accumulate { 1.0f32 } else { 0.0 });
        let s = &dev.stream;
        let (a, _ga) = w.data.device_ptr(s);
        let (b, _gb) = x.device_ptr(s);
        let (c, _gc) = out.device_ptr_mut(s);
        // Row-major out[n, rows] is column-major out[rows, n] = Wᵀ(col-major view of W) · x.
        // SAFETY: the pointers are live device buffers holding at least the sizes checked
        // above; alpha and beta are host scalars that outlive the call.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *self.handle.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                w.rows as i32,
                n as i32,
                w.cols as i32,
                &alpha as *const f32 as *const c_void,
                a as *const c_void,
                cudaDataType_t::CUDA_R_16BF,
                w.cols as i32,
                b as *const c_void,
                cudaDataType_t::CUDA_R_16BF,
                w.cols as i32,
                &beta as *const f32 as *const c_void,
                c as *mut c_void,
                cudaDataType_t::CUDA_R_32F,
                w.rows as i32,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(driver("cublasGemmEx"))
    }
}
