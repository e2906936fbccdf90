//! Device-side timing with events, and the copy-bandwidth probe.

use cudarc::driver::sys::CUevent_flags;

use crate::error::driver;
use crate::{CudaError, Device};

/// Runs `body` `warmup` times, then `iters` times with events around each run; returns the
/// milliseconds of each timed run.
pub fn time_runs(
    dev: &Device,
    warmup: usize,
    iters: usize,
    body: impl FnMut() -> Result<(), CudaError>,
) -> Result<Vec<f64>, CudaError> {
    time_grouped(dev, warmup, iters, 1, body)
}

/// [`time_runs`] with `per_mark` runs back to back between two events, as a model's layers
/// run: no event between them keeps a launch from starting while the one before drains.
/// Returns the milliseconds of a run, each group's time divided by `per_mark`.
pub fn time_grouped(
    dev: &Device,
    warmup: usize,
    iters: usize,
    per_mark: usize,
    mut body: impl FnMut() -> Result<(), CudaError>,
) -> Result<Vec<f64>, CudaError> {
    let per_mark = per_mark.max(1);
    for _ in 0..warmup * per_mark {
        body()?;
    }
    let ev = || {
        dev.ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver("cuEventCreate"))
    };
    let mut marks = Vec::with_capacity(iters + 1);
    marks.push(ev()?);
    marks[0]
        .record(&dev.stream)
        .map_err(driver("cuEventRecord"))?;
    for _ in 0..iters {
        for _ in 0..per_mark {
            body()?;
        }
        let e = ev()?;
        e.record(&dev.stream).map_err(driver("cuEventRecord"))?;
        marks.push(e);
    }
    dev.synchronize()?;
    marks
        .windows(2)
        .map(|w| {
            w[0].elapsed_ms(&w[1])
                .map(|ms| f64::from(ms) / per_mark as f64)
                .map_err(driver("cuEventElapsedTime"))
        })
        .collect()
}

/// The median of `v`; NaN when it is empty.
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Device-to-device copy bandwidth in GB/s, counting bytes read and written (the median of
/// `iters` copies of `bytes`).
pub fn copy_bandwidth(dev: &Device, bytes: usize, iters: usize) -> Result<f64, CudaError> {
    let s = &dev.stream;
    let src = dev.zeros::<u8>(bytes)?;
    let mut dst = dev.zeros::<u8>(bytes)?;
    let ms = time_runs(dev, 2, iters, || {
        s.memcpy_dtod(&src, &mut dst)
            .map_err(driver("cuMemcpyDtoD"))
    })?;
    Ok(2.0 * bytes as f64 / (median(&ms) * 1e-3) / 1e9)
}
