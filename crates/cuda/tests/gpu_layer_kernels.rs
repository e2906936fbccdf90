//! A decoder layer's row kernels on the GPU against the host, on fresh random inputs: RMSNorm of
//! rows held in registers (hidden a multiple of 4, up to 8192) and of longer or odd rows, taken
//! in order or gathered, written as bf16 or as the fp8 products' scaled f16. Skips visibly
//! without a GPU.

mod common;

use half::{bf16, f16};
use rand::{Rng, SeedableRng, rngs::StdRng};
use vortex_cuda::PoolDtype;
use vortex_cuda::blas::{F16_INPUT_SHIFT, Input};
use vortex_cuda::layer_kernels::LayerKernels;

/// `x[row] / rms(x[row]) * w`, in f64.
fn host_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f64> {
    let ss: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let inv = 1.0 / (ss / x.len() as f64 + f64::from(eps)).sqrt();
    x.iter()
        .zip(w)
        .map(|(&v, &g)| f64::from(v) * inv * f64::from(g))
        .collect()
}

#[test]
fn gpu_rms_norm_matches_the_host() {
    let Some(dev) = common::device_or_skip("gpu_rms_norm_matches_the_host") else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(common::test_seed());
    let kernels = LayerKernels::new(&dev, 128, 16, PoolDtype::Bf16).unwrap();
    let eps = 1e-6;
    // In registers: a full row of every thread, a short row, a row ending mid-thread. Looped:
    // past 8192 values, and not a multiple of 4.
    for hidden in [4096, 8192, 36, 2052, 8196, 4098, 7] {
        let n = 5;
        let x: Vec<f32> = (0..n * hidden)
            .map(|_| 40.0 * (rng.random::<f32>() * 2.0 - 1.0))
            .collect();
        let w: Vec<f32> = (0..hidden).map(|_| rng.random::<f32>() * 2.0).collect();
        let gathered: Vec<i32> = vec![3, 0, 4];
        let dx = dev.stream.clone_htod(&x).unwrap();
        let dw = dev.stream.clone_htod(&w).unwrap();
        let drows = dev.stream.clone_htod(&gathered).unwrap();
        for input in [Input::Bf16, Input::F16Scaled] {
            for rows in [None, Some(&gathered)] {
                let picked: Vec<usize> = match rows {
                    None => (0..n).collect(),
                    Some(r) => r.iter().map(|&i| i as usize).collect(),
                };
                let mut out = dev
                    .stream
                    .alloc_zeros::<bf16>(picked.len() * hidden)
                    .unwrap();
                kernels
                    .rms_norm(
                        &dev,
                        &dx,
                        rows.map(|_| &drows),
                        picked.len(),
                        &dw,
                        eps,
                        &mut out,
                        input,
                    )
                    .unwrap();
                let got = dev.stream.clone_dtoh(&out).unwrap();
                for (r, &src) in picked.iter().enumerate() {
                    let want = host_norm(&x[src * hidden..(src + 1) * hidden], &w, eps);
                    for (i, &v) in want.iter().enumerate() {
                        let raw = got[r * hidden + i];
                        let (value, step) = match input {
                            Input::Bf16 => (f64::from(raw.to_f32()), 2f64.powi(-8)),
                            Input::F16Scaled => (
                                f64::from(f16::from_bits(raw.to_bits()).to_f32())
                                    * f64::from(1u32 << F16_INPUT_SHIFT),
                                2f64.powi(-11),
                            ),
                        };
                        // One rounding of the output (f16's subnormals a fixed step), and f32's
                        // sum of squares.
                        assert!(
                            (value - v).abs() <= (step + 1e-5) * v.abs() + 2f64.powi(-16),
                            "hidden {hidden}, {input:?}, rows {rows:?}, row {r} value {i}: \
                             {value} against {v}"
                        );
                    }
                }
            }
        }
    }
}
