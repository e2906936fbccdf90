//! Launches that may begin before the kernel ahead of them in the stream has finished
//! (programmatic dependent launch, compute capability 9.0 and later): the driver sets up the
//! grid while the previous kernel drains, and the kernel waits (`griddepcontrol.wait`, which
//! returns at once in a kernel launched without the attribute) before it reads what that kernel
//! wrote.

use std::ffi::c_void;

use cudarc::driver::sys::{
    CUlaunchAttribute, CUlaunchAttributeID, CUlaunchConfig, cuLaunchKernelEx,
    cuOccupancyMaxActiveClusters,
};
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig};

use crate::error::driver;
use crate::{CudaError, Device, address};

/// Device helpers for the blocks of a cluster (`kernels/cluster.cu`), compiled in front of the
/// kernels that meet in a cluster's shared memory.
pub(crate) const CLUSTER: &str = include_str!("kernels/cluster.cu");

/// A kernel's arguments for [`launch`], each in an 8-byte slot (the driver reads as
/// many bytes as the parameter's size from the slot's start, which on a little-endian host is
/// the value).
#[derive(Default)]
pub struct RawArgs {
    slots: Vec<u64>,
}

impl RawArgs {
    pub fn buf<T>(&mut self, dev: &Device, buf: &CudaSlice<T>) -> &mut Self {
        self.slots.push(address(dev, buf));
        self
    }

    /// A buffer's address, or a null pointer.
    pub fn buf_or_null<T>(&mut self, dev: &Device, buf: Option<&CudaSlice<T>>) -> &mut Self {
        self.slots.push(buf.map_or(0, |b| address(dev, b)));
        self
    }

    /// A device address as it is (a buffer's, past its start).
    pub fn addr(&mut self, a: u64) -> &mut Self {
        self.slots.push(a);
        self
    }

    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.slots.push(u64::from(v));
        self
    }

    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.slots.push(u64::from(v as u32));
        self
    }

    pub fn f32(&mut self, v: f32) -> &mut Self {
        self.slots.push(u64::from(v.to_bits()));
        self
    }
}

/// Whether the device can launch kernels before their predecessor finishes.
pub fn supported(dev: &Device) -> bool {
    dev.capability.0 >= 9
}

/// Launches `func` on the device's stream; when `dependent` and the device can, it may begin
/// while the previous kernel runs.
///
/// # Safety
/// `args` must match the kernel's parameters in number, order and size, and a kernel launched
/// as a dependent must run `griddepcontrol.wait` before touching anything the previous kernel
/// writes, or wait for a flag that kernel releases after writing it (a table's ready flags).
pub unsafe fn launch(
    dev: &Device,
    func: &CudaFunction,
    cfg: LaunchConfig,
    args: &mut RawArgs,
    dependent: bool,
) -> Result<(), CudaError> {
    // SAFETY: the caller's guarantees are those `launch_in_clusters` asks.
    unsafe { launch_in_clusters(dev, func, cfg, args, dependent, None) }
}

/// [`launch`], with the grid cut into clusters of `cluster` blocks where given (an error on a
/// device without clusters, see [`Device::clusters`]).
///
/// # Safety
/// As [`launch`]; `cluster` must divide the grid.
pub unsafe fn launch_in_clusters(
    dev: &Device,
    func: &CudaFunction,
    cfg: LaunchConfig,
    args: &mut RawArgs,
    dependent: bool,
    cluster: Option<(u32, u32, u32)>,
) -> Result<(), CudaError> {
    dev.ctx
        .bind_to_thread()
        .map_err(driver("cuCtxSetCurrent"))?;
    // SAFETY: an all-zero attribute is valid; the ids and their values are set next.
    let mut attrs: [CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
    let mut count = 0;
    if dependent && supported(dev) {
        attrs[count].id =
            CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attrs[count].value.programmaticStreamSerializationAllowed = 1;
        count += 1;
    }
    if let Some((x, y, z)) = cluster {
        if !dev.clusters {
            return Err(CudaError::Unsupported(format!(
                "{} (compute capability {}.{}) cannot launch clusters of blocks",
                dev.name, dev.capability.0, dev.capability.1
            )));
        }
        attrs[count].id = CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        attrs[count].value.clusterDim.x = x;
        attrs[count].value.clusterDim.y = y;
        attrs[count].value.clusterDim.z = z;
        count += 1;
    }
    let config = CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: dev.stream.cu_stream(),
        attrs: attrs.as_mut_ptr(),
        numAttrs: count as u32,
    };
    let mut params: Vec<*mut c_void> = args
        .slots
        .iter_mut()
        .map(|s| (s as *mut u64).cast())
        .collect();
    // SAFETY: `config` and `params` outlive the call; the caller vouches for the arguments.
    unsafe {
        cuLaunchKernelEx(
            &config,
            func.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()
    .map_err(driver("cuLaunchKernelEx"))
}

/// The most blocks of `func` (a power of two up to `most`, each of `threads` threads and
/// `shared` bytes of dynamic shared memory) that this device runs as one cluster, as its driver
/// counts them: 1 on a device without clusters. A GPU slice whose processing clusters hold fewer
/// multiprocessors than a cluster needs would fail such a launch. A size the driver will not
/// count, for whatever reason, is not launched either: a smaller cluster (or none) computes the
/// same rows, so a failed query costs speed, not the model (`gpu_block_topk` checks that a
/// device with clusters allows them).
pub fn largest_cluster(
    dev: &Device,
    func: &CudaFunction,
    threads: u32,
    shared: u32,
    most: u32,
) -> Result<u32, CudaError> {
    if !dev.clusters || most < 2 {
        return Ok(1);
    }
    dev.ctx
        .bind_to_thread()
        .map_err(driver("cuCtxSetCurrent"))?;
    let mut size = 1 << most.ilog2();
    while size > 1 {
        // SAFETY: an all-zero attribute is valid; its id and value are set next.
        let mut attr: CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        attr.value.clusterDim.x = size;
        attr.value.clusterDim.y = 1;
        attr.value.clusterDim.z = 1;
        let config = CUlaunchConfig {
            gridDimX: size,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: threads,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: shared,
            hStream: dev.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        let mut clusters = 0;
        // SAFETY: `config` and its attribute outlive the call, which only reads them.
        let asked =
            unsafe { cuOccupancyMaxActiveClusters(&mut clusters, func.cu_function(), &config) };
        if asked.result().is_ok() && clusters >= 1 {
            return Ok(size);
        }
        size /= 2;
    }
    Ok(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The driver reads a parameter's bytes from the start of its slot.
    #[test]
    fn scalars_sit_at_the_start_of_their_slots() {
        let mut a = RawArgs::default();
        a.u32(7).i32(-2).f32(1.5);
        let bytes: Vec<[u8; 8]> = a.slots.iter().map(|s| s.to_le_bytes()).collect();
        assert_eq!(u32::from_le_bytes(bytes[0][..4].try_into().unwrap()), 7);
        assert_eq!(i32::from_le_bytes(bytes[1][..4].try_into().unwrap()), -2);
        assert_eq!(f32::from_le_bytes(bytes[2][..4].try_into().unwrap()), 1.5);
    }
}
