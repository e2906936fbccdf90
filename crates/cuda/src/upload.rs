//! A step's copies to the device, staged in page-locked memory. A copy from pageable memory
//! returns only once the stream has run it, after every kernel queued before it; from
//! page-locked memory it is queued like a launch, so a step's host work can go on while the
//! step before it runs.

use std::sync::Arc;

use cudarc::driver::sys::CUstreamCaptureStatus;
use cudarc::driver::{
    CudaEvent, CudaStream, CudaViewMut, DevicePtrMut, DeviceRepr, PinnedHostSlice,
};

use crate::CudaError;
use crate::error::driver;

/// Bytes of each of the two halves the staging memory is used in turn.
pub const HALF: usize = 4 << 20;
/// Where each staged copy starts, in bytes.
const ALIGN: usize = 64;

/// Page-locked staging memory used in two halves: copies fill one half; when the next does not
/// fit, a fence is queued behind that half's copies and the other half is taken once its own
/// fence has passed. A copy larger than a half goes from pageable memory.
pub struct Uploads {
    stream: Arc<CudaStream>,
    /// The memory, allocated at the first copy, and its address (taken once: reading it waits
    /// on an event).
    host: Option<(PinnedHostSlice<u8>, usize)>,
    /// The half being filled, and the first free byte in it.
    half: usize,
    at: usize,
    /// Per half: queued behind the last copy from it.
    fences: [Option<CudaEvent>; 2],
}

impl Uploads {
    /// Staging for copies queued on `stream`.
    pub fn new(stream: Arc<CudaStream>) -> Self {
        Self {
            stream,
            host: None,
            half: 0,
            at: 0,
            fences: [None, None],
        }
    }

    /// Queues a copy of `data` into `dst`.
    pub fn copy<T: DeviceRepr>(
        &mut self,
        data: &[T],
        dst: &mut CudaViewMut<T>,
    ) -> Result<(), CudaError> {
        if dst.len() < data.len() {
            return Err(CudaError::Invalid(format!(
                "a copy of {} values into {}",
                data.len(),
                dst.len()
            )));
        }
        let bytes = size_of_val(data);
        if bytes == 0 {
            return Ok(());
        }
        // A copy captured into a graph would read the staging memory again at every replay,
        // long after it holds other data.
        let stream = self.stream.clone();
        let capture = stream
            .capture_status()
            .map_err(driver("cuStreamIsCapturing"))?;
        if bytes > HALF || capture != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return stream
                .memcpy_htod(data, dst)
                .map_err(driver("cuMemcpyHtoD"));
        }
        let start = self.take(bytes)?;
        let base = self.host.as_ref().expect("allocated by take").1;
        // SAFETY: `take` returned `bytes` bytes at `start`, aligned for any `T` up to 64 bytes,
        // that no queued copy still reads; the memory lives as long as `self`, and the copy
        // below is queued before anything else writes there.
        let staged = unsafe {
            let p = (base + start) as *mut T;
            std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len());
            std::slice::from_raw_parts(p as *const T, data.len())
        };
        let (dst_ptr, _sync) = dst.device_ptr_mut(&stream);
        // SAFETY: `staged` is page-locked host memory of `bytes` bytes and `dst` holds at least
        // as many; both outlive the copy (the staging half is not reused before its fence).
        unsafe { cudarc::driver::result::memcpy_htod_async(dst_ptr, staged, stream.cu_stream()) }
            .map_err(driver("cuMemcpyHtoDAsync"))
    }

    /// `bytes` of staging memory no queued copy reads: the rest of the current half, else the
    /// other half once its fence has passed.
    fn take(&mut self, bytes: usize) -> Result<usize, CudaError> {
        let stream = &self.stream;
        if self.host.is_none() {
            // SAFETY: every byte is written before a copy reads it. Write-combined: the host
            // only writes here.
            let mut h = unsafe { stream.context().alloc_pinned::<u8>(2 * HALF) }
                .map_err(driver("cuMemHostAlloc"))?;
            let base = h.as_mut_ptr().map_err(driver("cuEventSynchronize"))? as usize;
            self.host = Some((h, base));
        }
        let mut at = self.at.next_multiple_of(ALIGN);
        if at + bytes > HALF {
            let fence = stream.record_event(None).map_err(driver("cuEventRecord"))?;
            self.fences[self.half] = Some(fence);
            self.half ^= 1;
            if let Some(f) = self.fences[self.half].take() {
                f.synchronize().map_err(driver("cuEventSynchronize"))?;
            }
            at = 0;
        }
        self.at = at + bytes;
        Ok(self.half * HALF + at)
    }
}

impl Drop for Uploads {
    /// The memory is freed only once no queued copy reads it.
    fn drop(&mut self) {
        if self.host.is_some() {
            let _ = self.stream.synchronize();
        }
    }
}
