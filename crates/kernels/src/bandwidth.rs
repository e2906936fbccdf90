//! Memory read bandwidth probe: the physical limit a bandwidth-bound kernel is compared with.

use std::hint::black_box;
use std::time::Instant;

use rayon::prelude::*;

use crate::simd::Simd;

/// f32 elements each parallel task sums (1 MiB).
const TASK_ELEMS: usize = 1 << 18;

/// Read bandwidth in GB/s (10^9 bytes per second) of a SIMD sum over an f32 buffer of `bytes`
/// bytes on all rayon threads; the best of `repeats` passes. Choose `bytes` well above the
/// last-level cache so the passes stream from DRAM.
pub fn measure_read_bandwidth(bytes: usize, repeats: usize) -> f64 {
    let simd = Simd::detect();
    let mut buf = vec![0.0f32; (bytes / 4).max(1)];
    // Writing every page makes it resident (untouched zero pages would all alias one frame).
    buf.par_chunks_mut(TASK_ELEMS)
        .enumerate()
        .for_each(|(i, chunk)| chunk.fill(i as f32));
    let read = (buf.len() * 4) as f64;
    (0..repeats.max(1))
        .map(|_| {
            let start = Instant::now();
            let total: f32 = buf.par_chunks(TASK_ELEMS).map(|c| simd.sum(c)).sum();
            black_box(total);
            read / start.elapsed().as_secs_f64() / 1e9
        })
        .fold(0.0, f64::max)
}
