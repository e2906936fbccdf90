//! A decoder layer's row kernels on the GPU against the host, on fresh random inputs: RMSNorm of
//! rows held in registers (hidden a multiple of 4, up to 8192) and of longer or odd rows, taken
//! in order or gathered, written as bf16 or as the fp8 products' scaled f16; Gemma 3's scaled
//! lookup, norm after a sublayer and GELU gate. Skips visibly without a GPU.

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

/// Gemma 3's row kernels against the host: the embedding lookup times sqrt(hidden), the norm of
/// a sublayer's output added to the residual stream, and the GELU (tanh) gate, with SiLU's
/// beside it.
#[test]
fn gpu_gemma_row_kernels_match_the_host() {
    let Some(dev) = common::device_or_skip("gpu_gemma_row_kernels_match_the_host") else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(common::test_seed());
    let kernels = LayerKernels::new(&dev, 256, 16, PoolDtype::Bf16).unwrap();
    let mut uniform = |n: usize, r: f32| -> Vec<f32> {
        (0..n)
            .map(|_| r * (rng.random::<f32>() * 2.0 - 1.0))
            .collect()
    };

    // The lookup: one f32 product a value, as the host's.
    let (vocab, hidden) = (300, 640);
    let table: Vec<bf16> = uniform(vocab * hidden, 0.1)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    let tokens: Vec<u32> = vec![7, 299, 0, 7, 123];
    let scale = (hidden as f32).sqrt();
    let mut x = dev
        .stream
        .alloc_zeros::<f32>(tokens.len() * hidden)
        .unwrap();
    let dt = dev.stream.clone_htod(&table).unwrap();
    let dtok = dev.stream.clone_htod(&tokens).unwrap();
    kernels
        .embed(&dev, &dt, &dtok, tokens.len(), hidden, scale, &mut x)
        .unwrap();
    let got = dev.stream.clone_dtoh(&x).unwrap();
    for (r, &t) in tokens.iter().enumerate() {
        for i in 0..hidden {
            let want = table[t as usize * hidden + i].to_f32() * scale;
            assert_eq!(got[r * hidden + i], want, "row {r} value {i}");
        }
    }

    // x += rms_norm(y) * w, rows in place.
    let (n, eps) = (6, 1e-6);
    for hidden in [640, 1152, 2560, 37] {
        let x0 = uniform(n * hidden, 20.0);
        let y = uniform(n * hidden, 5.0);
        let w = uniform(hidden, 2.0);
        let mut dx = dev.stream.clone_htod(&x0).unwrap();
        let dy = dev.stream.clone_htod(&y).unwrap();
        let dw = dev.stream.clone_htod(&w).unwrap();
        kernels
            .rms_norm_add(&dev, &dy, n, &dw, eps, &mut dx)
            .unwrap();
        let got = dev.stream.clone_dtoh(&dx).unwrap();
        for r in 0..n {
            let row = r * hidden..(r + 1) * hidden;
            let normed = host_norm(&y[row.clone()], &w, eps);
            for (i, v) in normed.iter().enumerate() {
                let want = f64::from(x0[row.start + i]) + v;
                let value = f64::from(got[row.start + i]);
                let bound = 1e-5 * (f64::from(x0[row.start + i]).abs() + v.abs()) + 1e-6;
                assert!(
                    (value - want).abs() <= bound,
                    "hidden {hidden}, row {r} value {i}: {value} against {want}"
                );
            }
        }
    }

    // The gates, written as bf16: one rounding of the output, and f32's exponential (whose
    // 1 - 2 / (e^2y + 1) loses what is below f32's step near 2 for very negative gates).
    let (rows, ffn) = (4, 1000);
    let gu = uniform(rows * 2 * ffn, 6.0);
    let dgu = dev.stream.clone_htod(&gu).unwrap();
    for gelu in [true, false] {
        let mut out = dev.stream.alloc_zeros::<bf16>(rows * ffn).unwrap();
        kernels
            .gate_mul(&dev, &dgu, rows, ffn, gelu, &mut out, Input::Bf16)
            .unwrap();
        let got = dev.stream.clone_dtoh(&out).unwrap();
        for r in 0..rows {
            for c in 0..ffn {
                let g = f64::from(gu[r * 2 * ffn + c]);
                let u = f64::from(gu[r * 2 * ffn + ffn + c]);
                let act = if gelu {
                    let inner = (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g.powi(3));
                    0.5 * g * (1.0 + inner.tanh())
                } else {
                    g / (1.0 + (-g).exp())
                };
                let want = act * u;
                let value = f64::from(got[r * ffn + c].to_f32());
                let bound = 2f64.powi(-8) * want.abs() + 1e-5 * u.abs() * (1.0 + g.abs());
                assert!(
                    (value - want).abs() <= bound,
                    "gelu {gelu}, row {r} value {c}: {value} against {want} (gate {g}, up {u})"
                );
            }
        }
    }
}
