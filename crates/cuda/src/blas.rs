//! Matrix products with f32 accumulation and output: bf16 weights through cuBLAS, fp8 weights
//! through [`crate::fp8_weights`].

use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::cublas::CudaBlas;
use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t,
};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use half::bf16;

use crate::error::driver;
use crate::fp8_weights::{Fp8Kernels, Fp8Matrix};
use crate::{CudaError, Device, libs};

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

/// A weight matrix as stored on the device.
pub enum Matrix {
    Bf16(GpuMatrix),
    Fp8(Fp8Matrix),
}

impl Matrix {
    pub fn rows(&self) -> usize {
        match self {
            Matrix::Bf16(m) => m.rows,
            Matrix::Fp8(m) => m.rows,
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Matrix::Bf16(m) => m.cols,
            Matrix::Fp8(m) => m.cols,
        }
    }

    /// Bytes a product reads: the values and, for fp8, the scales.
    pub fn bytes(&self) -> usize {
        match self {
            Matrix::Bf16(m) => m.bytes(),
            Matrix::Fp8(m) => m.bytes(),
        }
    }
}

/// A cuBLAS handle on the device's stream.
pub struct Cublas {
    /// Back to [`SPARE`] when dropped, never destroyed.
    handle: ManuallyDrop<CudaBlas>,
    stream: Arc<CudaStream>,
    /// The context the handle was made in.
    ctx: usize,
}

/// cuBLAS handles no longer used, each with its context, for the next [`Cublas`] made there.
/// `cublasDestroy` synchronizes the whole context, and the driver has crashed (SIGSEGV in
/// `cuCtxSynchronize`) doing that while other threads worked in the same context: a handle is
/// made once and reused, never destroyed. A spare handle holds its stream and so its context.
static SPARE: Mutex<Vec<(usize, CudaBlas)>> = Mutex::new(Vec::new());

impl Cublas {
    fn new(dev: &Device) -> Result<Self, CudaError> {
        libs::load_cublas()?;
        let ctx = dev.ctx.cu_ctx() as usize;
        let spare = {
            let mut spare = SPARE.lock().unwrap_or_else(PoisonError::into_inner);
            let at = spare.iter().position(|(c, _)| *c == ctx);
            at.map(|i| spare.swap_remove(i).1)
        };
        let handle = match spare {
            Some(mut h) => {
                dev.ctx
                    .bind_to_thread()
                    .map_err(driver("cuCtxSetCurrent"))?;
                // SAFETY: the handle's last stream finished its work before the handle was
                // spared (`drop`), so nothing queued there still uses the handle's workspace.
                if let Err(e) = unsafe { h.set_stream(dev.stream.clone()) } {
                    // Dropped, it would be destroyed.
                    std::mem::forget(h);
                    return Err(driver("cublasSetStream")(e));
                }
                h
            }
            None => CudaBlas::new(dev.stream.clone()).map_err(driver("cublasCreate"))?,
        };
        Ok(Self {
            handle: ManuallyDrop::new(handle),
            stream: dev.stream.clone(),
            ctx,
        })
    }
}

impl Drop for Cublas {
    fn drop(&mut self) {
        // A handle whose stream cannot finish its work is left as it is, never reused (its
        // workspace may still be in use) nor destroyed.
        if self.stream.synchronize().is_err() {
            return;
        }
        // SAFETY: taken once, here, and not used after.
        let handle = unsafe { ManuallyDrop::take(&mut self.handle) };
        let mut spare = SPARE.lock().unwrap_or_else(PoisonError::into_inner);
        spare.push((self.ctx, handle));
    }
}

impl Cublas {
    /// Columns `[col0, col0 + rows)` of `out[n, ld]` = `x[n, cols] · wᵀ` for a `rows x cols`
    /// bf16 `w`, plus what they held when `accumulate` is set.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_rows(
        &self,
        dev: &Device,
        x: &CudaSlice<bf16>,
        n: usize,
        w: &CudaSlice<bf16>,
        rows: usize,
        cols: usize,
        out: &mut CudaSlice<f32>,
        ld: usize,
        col0: usize,
        accumulate: bool,
    ) -> Result<(), CudaError> {
        let fits = x.len() >= n * cols
            && w.len() >= rows * cols
            && col0 + rows <= ld
            && (n == 0 || out.len() >= (n - 1) * ld + col0 + rows);
        if !fits {
            return Err(CudaError::Invalid(format!(
                "matmul [{n} x {cols}] by [{rows} x {cols}]ᵀ into columns {col0}.. of [{n} x {ld}]: buffers of {}, {} and {} elements",
                x.len(),
                w.len(),
                out.len()
            )));
        }
        if n == 0 || rows == 0 {
            return Ok(());
        }
        let dims = [n, rows, cols, ld];
        if dims.iter().any(|&d| d > i32::MAX as usize) {
            return Err(CudaError::Unsupported(format!(
                "matmul dimensions {dims:?}"
            )));
        }
        let (alpha, beta) = (1.0f32, if accumulate { 1.0f32 } else { 0.0 });
        let s = &dev.stream;
        let (a, _ga) = w.device_ptr(s);
        let (b, _gb) = x.device_ptr(s);
        let (c, _gc) = out.device_ptr_mut(s);
        let c = c + (col0 * 4) as u64;
        // Row-major out[n, ld] is column-major out[ld, n] = Wᵀ(col-major view of W) · x.
        // SAFETY: the pointers are live device buffers holding at least the sizes checked
        // above; alpha and beta are host scalars that outlive the call.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *self.handle.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                rows as i32,
                n as i32,
                cols as i32,
                &alpha as *const f32 as *const c_void,
                a as *const c_void,
                cudaDataType_t::CUDA_R_16BF,
                cols as i32,
                b as *const c_void,
                cudaDataType_t::CUDA_R_16BF,
                cols as i32,
                &beta as *const f32 as *const c_void,
                c as *mut c_void,
                cudaDataType_t::CUDA_R_32F,
                ld as i32,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(driver("cublasGemmEx"))
    }
}

/// How a product's rows of x are stored (16 bits a value either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    Bf16,
    /// f16 of the values times 2^-[`F16_INPUT_SHIFT`], which the fp8 products of up to 64 rows
    /// take (on the tensor cores): their weights widen to f16 in one instruction a pair, and
    /// activations up to 65504 * 2^8 (about 1.7e7) keep their value; larger ones saturate
    /// there. Below 2^-6 a value keeps fewer bits, within 2^-17, which the e4m3 weights' own
    /// rounding (2^-4 of each weight) dwarfs.
    F16Scaled,
}

/// The power of two by which [`Input::F16Scaled`] divides the values (a define of the kernels
/// that write x and of the products).
pub const F16_INPUT_SHIFT: i32 = 8;

impl Input {
    /// The kernels' flag: 1 for f16.
    pub fn f16_flag(self) -> i32 {
        i32::from(self == Input::F16Scaled)
    }
}

/// A model's matrix products: cuBLAS, and the fp8 kernels once fp8 weights are in use.
pub struct Blas {
    cublas: Cublas,
    fp8: Option<Fp8Kernels>,
}

impl Blas {
    pub fn new(dev: &Device) -> Result<Self, CudaError> {
        Ok(Self {
            cublas: Cublas::new(dev)?,
            fp8: None,
        })
    }

    /// The cuBLAS handle.
    pub fn cublas(&self) -> &Cublas {
        &self.cublas
    }

    /// The fp8 kernels, built on first use.
    pub fn fp8(&mut self, dev: &Device) -> Result<&mut Fp8Kernels, CudaError> {
        built(&mut self.fp8, dev)
    }

    /// How the product of `n` rows by `w` takes its rows of x.
    pub fn input_for(n: usize, w: &Matrix) -> Input {
        match w {
            Matrix::Bf16(_) => Input::Bf16,
            Matrix::Fp8(m) => Fp8Kernels::input_for(n, m.cols),
        }
    }

    /// `out[n, w.rows] = x[n, w.cols] · wᵀ`, plus what `out` held when `accumulate` is set
    /// (the residual add of a layer, fused into the product). `x` must be stored as
    /// [`Blas::input_for`] says.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        &mut self,
        dev: &Device,
        x: &CudaSlice<bf16>,
        input: Input,
        n: usize,
        w: &Matrix,
        out: &mut CudaSlice<f32>,
        accumulate: bool,
    ) -> Result<(), CudaError> {
        match w {
            Matrix::Bf16(m) => {
                if input != Input::Bf16 {
                    return Err(CudaError::Invalid(format!(
                        "a bf16 matrix's product takes x as bf16, not {input:?}"
                    )));
                }
                self.cublas.gemm_rows(
                    dev, x, n, &m.data, m.rows, m.cols, out, m.rows, 0, accumulate,
                )
            }
            Matrix::Fp8(m) => built(&mut self.fp8, dev)?.matmul(
                dev,
                &self.cublas,
                x,
                input,
                n,
                m,
                out,
                accumulate,
            ),
        }
    }
}

/// The kernels in `slot`, built there first if absent (a free function, so that the caller may
/// still borrow the cuBLAS handle beside them).
fn built<'a>(
    slot: &'a mut Option<Fp8Kernels>,
    dev: &Device,
) -> Result<&'a mut Fp8Kernels, CudaError> {
    match slot {
        Some(k) => Ok(k),
        None => Ok(slot.insert(Fp8Kernels::new(dev)?)),
    }
}
