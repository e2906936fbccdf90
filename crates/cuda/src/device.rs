//! One CUDA device, opened at run time.

use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{self, CUdevice_attribute as Attr};
use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, CudaViewMut, DeviceRepr, ValidAsZeroBits,
};

use crate::error::driver;
use crate::upload::Uploads;
use crate::{CudaError, libs};

/// A device with its context and the stream all work is queued on.
pub struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub ordinal: usize,
    pub name: String,
    /// Compute capability, e.g. (9, 0) for Hopper.
    pub capability: (i32, i32),
    pub sms: usize,
    pub total_mem: usize,
    /// Shared memory one block may take, static and dynamic together (with the opt-in).
    pub block_shared: usize,
    /// Shared memory of one SM, for all its resident blocks.
    pub sm_shared: usize,
    /// Whether kernels may launch in clusters of blocks (compute capability 9.0 and later,
    /// where the driver says so).
    pub clusters: bool,
    uploads: Mutex<Uploads>,
}

impl Device {
    /// Opens device `ordinal`. Without a driver, NVRTC or such a device this is
    /// [`CudaError::Unavailable`], never a panic.
    pub fn open(ordinal: usize) -> Result<Self, CudaError> {
        libs::load()?;
        let count = CudaContext::device_count()
            .map_err(|e| CudaError::Unavailable(format!("the driver reports no device ({e:?})")))?;
        if ordinal >= count.max(0) as usize {
            return Err(CudaError::Unavailable(format!(
                "device cuda:{ordinal} requested, but {count} CUDA device(s) present"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(driver("cuCtxCreate"))?;
        // One stream does all the work: the per-buffer event tracking for several streams
        // would only add calls to every launch.
        // SAFETY: no other stream of this context touches our buffers.
        unsafe { ctx.disable_event_tracking() };
        // A stream of our own rather than the legacy default one, which cannot be captured
        // into a graph.
        let stream = ctx.new_stream().map_err(driver("cuStreamCreate"))?;
        let name = ctx.name().map_err(driver("cuDeviceGetName"))?;
        let capability = ctx
            .compute_capability()
            .map_err(driver("cuDeviceGetAttribute"))?;
        let sms = ctx
            .attribute(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver("cuDeviceGetAttribute"))? as usize;
        let total_mem = ctx.total_mem().map_err(driver("cuDeviceTotalMem"))?;
        let block_shared = ctx
            .attribute(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(driver("cuDeviceGetAttribute"))? as usize;
        let sm_shared = ctx
            .attribute(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)
            .map_err(driver("cuDeviceGetAttribute"))? as usize;
        // A driver that does not know the attribute cannot launch clusters either.
        let clusters = capability.0 >= 9
            && ctx
                .attribute(Attr::CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH)
                .is_ok_and(|v| v == 1);
        Ok(Self {
            ctx,
            uploads: Mutex::new(Uploads::new(stream.clone())),
            stream,
            ordinal,
            name,
            capability,
            sms,
            total_mem,
            block_shared,
            sm_shared,
            clusters,
        })
    }

    /// The NVRTC target of this device, e.g. `sm_90`.
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.capability.0, self.capability.1)
    }

    /// Queues a copy of `data` into `dst` through page-locked staging memory, without waiting
    /// for the work queued before it (see `upload.rs`).
    pub fn upload<T: DeviceRepr>(
        &self,
        data: &[T],
        dst: &mut CudaViewMut<T>,
    ) -> Result<(), CudaError> {
        // A panic elsewhere while holding the lock leaves the staging state as consistent as
        // any copy before it.
        let mut up = self.uploads.lock().unwrap_or_else(|e| e.into_inner());
        up.copy(data, dst)
    }

    /// `len` zeroed values on the device. Running out of memory says how much was asked for
    /// and how much was free.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> Result<CudaSlice<T>, CudaError> {
        // The driver takes a byte count: one that wraps would leave a slice longer than its
        // memory.
        let bytes = len
            .checked_mul(size_of::<T>())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| {
                CudaError::Invalid(format!(
                    "a device buffer of {len} values of {} bytes is too large",
                    size_of::<T>()
                ))
            })?;
        let out_of_memory = |mut detail: String| {
            let asked = bytes >> 20;
            detail += &match self.ctx.mem_get_info() {
                Ok((free, total)) => format!(
                    " asking for {asked} MiB, with {} MiB free of {} MiB",
                    free >> 20,
                    total >> 20
                ),
                Err(_) => format!(" asking for {asked} MiB"),
            };
            CudaError::Driver {
                call: "cuMemAlloc",
                detail,
            }
        };
        // The stream-ordered allocator takes the device's free memory for a moment before it
        // fails a request past it: other threads' allocations failed meanwhile, and a cuBLAS
        // handle torn down meanwhile crashed in the driver. A request past the whole device
        // never reaches it.
        if bytes > self.total_mem {
            return Err(out_of_memory(
                "CUDA_ERROR_OUT_OF_MEMORY, more than the device holds:".into(),
            ));
        }
        self.stream.alloc_zeros(len).map_err(|e| {
            let detail = format!("{e:?}");
            if detail.contains("OUT_OF_MEMORY") {
                out_of_memory(detail)
            } else {
                CudaError::Driver {
                    call: "cuMemAlloc",
                    detail,
                }
            }
        })
    }

    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.stream
            .synchronize()
            .map_err(driver("cuStreamSynchronize"))
    }

    /// The device's free and total memory in bytes, once every buffer freed in this context
    /// has gone back to the device. A buffer is freed in stream order into the device's
    /// memory pool, which returns it at a synchronisation of the stream that freed it: the
    /// context's synchronisation covers streams other than this one (a model dropped before,
    /// another engine's), and the trim returns what the pool would still hold on to.
    pub fn memory_info(&self) -> Result<(usize, usize), CudaError> {
        self.synchronize()?;
        self.ctx.synchronize().map_err(driver("cuCtxSynchronize"))?;
        let pools = self
            .ctx
            .attribute(Attr::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)
            .map_err(driver("cuDeviceGetAttribute"))?;
        if pools != 0 {
            let mut pool = std::ptr::null_mut();
            // SAFETY: `pool` is written by the call; the device is this context's.
            unsafe { sys::cuDeviceGetMemPool(&mut pool, self.ctx.cu_device()) }
                .result()
                .map_err(driver("cuDeviceGetMemPool"))?;
            // SAFETY: the pool is the device's current one, live while the context is.
            unsafe { sys::cuMemPoolTrimTo(pool, 0) }
                .result()
                .map_err(driver("cuMemPoolTrimTo"))?;
        }
        self.ctx.mem_get_info().map_err(driver("cuMemGetInfo"))
    }

    /// A one-line description: name, SMs, memory.
    pub fn describe(&self) -> String {
        format!(
            "cuda:{} {} ({}, {} SMs, {:.0} GiB)",
            self.ordinal,
            self.name,
            self.arch(),
            self.sms,
            self.total_mem as f64 / (1u64 << 30) as f64
        )
    }
}
