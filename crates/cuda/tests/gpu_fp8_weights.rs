//! fp8 weight matrices on the GPU against the host: the device's quantization byte for byte,
//! and products of 1 to 130 rows (the tensor-core kernel, its k split over blocks, and the
//! dequantized slices through cuBLAS) against an f64 product of the same fp8 values, on fresh
//! random inputs. Skips visibly without a GPU.

mod common;

use half::bf16;
use rand::{Rng, SeedableRng, rngs::StdRng};
use vortex_cuda::blas::{Blas, GpuMatrix, Matrix};
use vortex_cuda::fp8;
use vortex_cuda::fp8_weights::MAX_STEP_ROWS;

fn seeded_rng() -> StdRng {
    let seed: u64 = match std::env::var("VORTEX_TEST_SEED") {
        Ok(s) => s.parse().expect("VORTEX_TEST_SEED: a u64"),
        Err(_) => rand::rng().random(),
    };
    eprintln!("seed {seed}");
    StdRng::seed_from_u64(seed)
}

fn random_bf16(rng: &mut StdRng, n: usize, scale: f32) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f32(scale * (rng.random::<f32>() * 2.0 - 1.0)))
        .collect()
}

#[test]
fn gpu_fp8_quantization_matches_the_host() {
    let Some(dev) = common::device_or_skip("gpu_fp8_quantization_matches_the_host") else {
        return;
    };
    let mut rng = seeded_rng();
    let mut blas = Blas::new(&dev).unwrap();
    for (rows, cols) in [(45, 128), (7, 1000), (64, 4096)] {
        let mut host = random_bf16(&mut rng, rows * cols, 0.05);
        // A zero row, a row of one large value, and values past e4m3's smallest step.
        host[..cols].fill(bf16::ZERO);
        host[cols + 3] = bf16::from_f32(300.0);
        host[2 * cols] = bf16::from_f32(1e-3);
        host[2 * cols + 1] = bf16::from_f32(-2e-7);
        let w = GpuMatrix {
            data: dev.stream.clone_htod(&host).unwrap(),
            rows,
            cols,
        };
        let m = blas.fp8(&dev).unwrap().quantize(&dev, &w).unwrap();
        let bytes = dev.stream.clone_dtoh(&m.data).unwrap();
        let scales = dev.stream.clone_dtoh(&m.scales).unwrap();
        for r in 0..rows {
            let row: Vec<f32> = host[r * cols..(r + 1) * cols]
                .iter()
                .map(|v| v.to_f32())
                .collect();
            let (scale, want) = fp8::quantize_row(&row);
            assert_eq!(
                scales[r].to_bits(),
                scale.to_bits(),
                "{rows}x{cols} row {r}'s scale"
            );
            assert_eq!(
                &bytes[r * cols..(r + 1) * cols],
                &want[..],
                "{rows}x{cols} row {r}"
            );
        }
    }
}

/// `out` against `init` (when accumulating) plus x · wᵀ in f64, for the listed rows of w: each
/// output within `tol` of the sum of its terms' magnitudes.
#[allow(clippy::too_many_arguments)]
fn check(
    what: &str,
    got: &[f32],
    init: &[f32],
    accumulate: bool,
    x: &[bf16],
    w: &[f32],
    n: usize,
    rows: usize,
    cols: usize,
    check_rows: &[usize],
    tol: f64,
) {
    for t in 0..n {
        let xt = &x[t * cols..(t + 1) * cols];
        for &r in check_rows {
            let wr = &w[r * cols..(r + 1) * cols];
            let (mut sum, mut mag) = (0f64, 0f64);
            for (a, b) in xt.iter().zip(wr) {
                let p = a.to_f64() * f64::from(*b);
                sum += p;
                mag += p.abs();
            }
            let i = t * rows + r;
            let want = if accumulate {
                f64::from(init[i]) + sum
            } else {
                sum
            };
            let err = (f64::from(got[i]) - want).abs();
            assert!(
                err <= tol * mag + 1e-6 * f64::from(init[i].abs()) + 1e-12,
                "{what}: token {t} row {r}: {} against {want} (terms' magnitude {mag})",
                got[i]
            );
        }
    }
}

#[test]
fn gpu_fp8_products_match_the_host() {
    let Some(dev) = common::device_or_skip("gpu_fp8_products_match_the_host") else {
        return;
    };
    let mut rng = seeded_rng();
    let mut blas = Blas::new(&dev).unwrap();
    // (rows, cols): ragged row blocks, k split over blocks (1000 x 2048, 300 x 4096), k not a
    // multiple of the kernel's chunk (96: through cuBLAS at any n), and a matrix past the
    // dequantized slice (9000 x 4096 > 2^25 values: two slices).
    for (rows, cols) in [(45, 128), (1000, 2048), (300, 4096), (70, 96), (9000, 4096)] {
        let host = random_bf16(&mut rng, rows * cols, 0.05);
        let w = GpuMatrix {
            data: dev.stream.clone_htod(&host).unwrap(),
            rows,
            cols,
        };
        let m = blas.fp8(&dev).unwrap().quantize(&dev, &w).unwrap();
        drop(w);
        let bytes = dev.stream.clone_dtoh(&m.data).unwrap();
        let scales = dev.stream.clone_dtoh(&m.scales).unwrap();
        let deq: Vec<f32> = bytes
            .iter()
            .enumerate()
            .map(|(i, &b)| fp8::to_f32(b) * scales[i / cols])
            .collect();
        let m = Matrix::Fp8(m);
        let check_rows: Vec<usize> = if rows > 2000 {
            // Around the slices' seam and a spread of others.
            (0..rows)
                .filter(|r| r % 97 == 0 || r.abs_diff(8192) < 40)
                .collect()
        } else {
            (0..rows).collect()
        };
        for n in [1, 3, 8, 16, 17, 33, 64, 65, 130] {
            if rows > 2000 && n < MAX_STEP_ROWS {
                continue;
            }
            for accumulate in [false, true] {
                let x = random_bf16(&mut rng, n * cols, 2.0);
                let init: Vec<f32> = (0..n * rows).map(|_| rng.random::<f32>() - 0.5).collect();
                let xd = dev.stream.clone_htod(&x).unwrap();
                let mut out = dev.stream.clone_htod(&init).unwrap();
                blas.matmul(&dev, &xd, n, &m, &mut out, accumulate).unwrap();
                let got = dev.stream.clone_dtoh(&out).unwrap();
                let tensor_cores = n <= MAX_STEP_ROWS && cols % 64 == 0;
                // cuBLAS multiplies the weights rounded to bf16 (8 significant bits).
                let tol = if tensor_cores { 1e-4 } else { 4e-3 };
                let what = format!("{rows}x{cols}, {n} rows, accumulate {accumulate}");
                check(
                    &what,
                    &got,
                    &init,
                    accumulate,
                    &x,
                    &deq,
                    n,
                    rows,
                    cols,
                    &check_rows,
                    tol,
                );
                // Split blocks reset their counters: the same product again is the same, bit
                // for bit.
                let mut again = dev.stream.clone_htod(&init).unwrap();
                blas.matmul(&dev, &xd, n, &m, &mut again, accumulate)
                    .unwrap();
                let again = dev.stream.clone_dtoh(&again).unwrap();
                assert!(
                    got.iter()
                        .zip(&again)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{what}: a second run differs"
                );
            }
        }
    }
}

/// Times the products of Qwen3-8B's and Qwen3-1.7B's matrices at 16 and 64 rows: fp8 on the
/// tensor cores (each shape of `VORTEX_FP8_SHAPES`, `warps up to 16 rows/warps beyond/depth`, comma-separated,,
/// default the shipped one) against bf16 through cuBLAS, each run over copies of the matrix
/// that together exceed L2 twice over. Prints microseconds and weight bytes a second.
#[test]
#[ignore]
fn gpu_fp8_product_speed() {
    use vortex_cuda::fp8_weights::{Fp8Kernels, Fp8Shape};
    use vortex_cuda::timing::{median, time_runs};
    let Some(dev) = common::device_or_skip("gpu_fp8_product_speed") else {
        return;
    };
    let shapes: Vec<Fp8Shape> = match std::env::var("VORTEX_FP8_SHAPES") {
        Ok(s) => s
            .split(',')
            .map(|v| {
                let p: Vec<usize> = v.split('/').map(|x| x.parse().unwrap()).collect();
                Fp8Shape {
                    warps: [p[0], p[1]],
                    depth: p[2],
                }
            })
            .collect(),
        Err(_) => vec![Fp8Shape::default()],
    };
    let mut blas = Blas::new(&dev).unwrap();
    let matrices = [
        ("8B qkv", 6144, 4096),
        ("8B o", 4096, 4096),
        ("8B gate|up", 24576, 4096),
        ("8B down", 4096, 12288),
        ("1.7B qkv", 4096, 2048),
        ("1.7B o", 2048, 2048),
        ("1.7B gate|up", 12288, 2048),
        ("1.7B down", 2048, 6144),
        ("head", 151_936, 4096),
    ];
    let mut kernels: Vec<Fp8Kernels> = shapes
        .iter()
        .map(|&s| Fp8Kernels::with_shape(&dev, s).unwrap())
        .collect();
    println!(
        "{:<14} {:>3} {:>12} {}",
        "matrix", "n", "bf16 cuBLAS", "fp8 (us, GB/s of weights)"
    );
    for (name, rows, cols) in matrices {
        let copies = (200usize << 20).div_ceil(rows * cols).max(1);
        let bf: Vec<GpuMatrix> = (0..copies)
            .map(|_| GpuMatrix {
                data: dev.stream.alloc_zeros::<bf16>(rows * cols).unwrap(),
                rows,
                cols,
            })
            .collect();
        let fp: Vec<Matrix> = bf
            .iter()
            .map(|m| Matrix::Fp8(blas.fp8(&dev).unwrap().quantize(&dev, m).unwrap()))
            .collect();
        let bf: Vec<Matrix> = bf.into_iter().map(Matrix::Bf16).collect();
        for n in [16, 64] {
            let x = dev.stream.alloc_zeros::<bf16>(n * cols).unwrap();
            let mut out = dev.stream.alloc_zeros::<f32>(n * rows).unwrap();
            let mut i = 0;
            let bf_us = median(
                &time_runs(&dev, 3, 30, || {
                    i += 1;
                    blas.matmul(&dev, &x, n, &bf[i % copies], &mut out, false)
                })
                .unwrap(),
            ) * 1e3;
            let mut line = format!(
                "{name:<14} {n:>3} {bf_us:>7.1} {:>4.0}",
                (rows * cols * 2) as f64 / bf_us / 1e3
            );
            for (shape, k) in shapes.iter().zip(&mut kernels) {
                k.reserve(&dev, rows, cols).unwrap();
                let us = median(
                    &time_runs(&dev, 3, 30, || {
                        i += 1;
                        let Matrix::Fp8(m) = &fp[i % copies] else {
                            unreachable!("quantized above")
                        };
                        k.matmul(&dev, blas.cublas(), &x, n, m, &mut out, false)
                    })
                    .unwrap(),
                ) * 1e3;
                line += &format!(
                    " | {}/{}/{} x{}: {us:>6.1} {:>4.0}",
                    shape.warps[0],
                    shape.warps[1],
                    shape.depth,
                    k.plan(n, rows, cols).splits,
                    (rows * (cols + 4)) as f64 / us / 1e3
                );
            }
            println!("{line}");
        }
    }
}
