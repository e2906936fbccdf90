//! fp8 weight matrices on the GPU against the host: the device's quantization byte for byte,
//! and products of 1 to 130 rows (the tensor-core kernel in the shipped shape and another, its
//! k split over blocks, and the dequantized slices through cuBLAS) against an f64 product of
//! the same fp8 values and the x each path takes (bf16, or scaled f16 on the tensor cores), on
//! fresh random inputs. Skips visibly without a GPU.

mod common;

use half::bf16;
use rand::{Rng, SeedableRng, rngs::StdRng};
use vortex_cuda::blas::{Blas, F16_INPUT_SHIFT, GpuMatrix, Input, Matrix};
use vortex_cuda::fp8;
use vortex_cuda::fp8_weights::{
    Fp8Kernels, Fp8Shape, MAX_CLUSTER, MAX_STEP_ROWS, TALL_BLOCKS_PER_SM,
};

fn seeded_rng() -> StdRng {
    StdRng::seed_from_u64(common::test_seed())
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

/// `x` on the device as `input` stores it, and the values the product multiplies by.
fn stored(
    dev: &vortex_cuda::Device,
    x: &[bf16],
    input: Input,
) -> (cudarc::driver::CudaSlice<bf16>, Vec<f64>) {
    let (bits, values): (Vec<bf16>, Vec<f64>) = match input {
        Input::Bf16 => x.iter().map(|&v| (v, v.to_f64())).unzip(),
        Input::F16Scaled => {
            let scale = (-F16_INPUT_SHIFT as f32).exp2();
            x.iter()
                .map(|&v| {
                    let h = half::f16::from_f32(v.to_f32() * scale);
                    (
                        bf16::from_bits(h.to_bits()),
                        h.to_f64() * f64::from(scale).recip(),
                    )
                })
                .unzip()
        }
    };
    (dev.stream.clone_htod(&bits).unwrap(), values)
}

/// `out` against `init` (when accumulating) plus x · wᵀ in f64, for the listed rows of w: each
/// output within `tol` of the sum of its terms' magnitudes.
#[allow(clippy::too_many_arguments)]
fn check(
    what: &str,
    got: &[f32],
    init: &[f32],
    accumulate: bool,
    x: &[f64],
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
                let p = a * f64::from(*b);
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

/// `VORTEX_FP8_SHAPES`: comma-separated `warps up to 16 rows/warps beyond/depth[/warps up to
/// 16 rows of tall matrices[/blocks a multiprocessor[/clusters, 0 or 1]]]` (e.g. `8/4/1` or
/// `8/4/1/4/2/1`; without the fourth, tall matrices take the first; without the fifth, 2;
/// without the sixth, 1), or `default` when unset.
fn shapes_from_env(default: Vec<Fp8Shape>) -> Vec<Fp8Shape> {
    let Ok(list) = std::env::var("VORTEX_FP8_SHAPES") else {
        return default;
    };
    list.split(',')
        .map(|v| {
            let p: Vec<usize> = v
                .split('/')
                .map(|x| x.parse().expect("VORTEX_FP8_SHAPES: numbers"))
                .collect();
            assert!(
                (3..=6).contains(&p.len()),
                "VORTEX_FP8_SHAPES: three to six numbers a shape, {v}"
            );
            Fp8Shape {
                warps: [p[0], p[1]],
                depth: p[2],
                tall_warps: p.get(3).copied().unwrap_or(0),
                blocks_per_sm: p.get(4).copied().unwrap_or(2),
                clusters: p.get(5).is_none_or(|&c| c != 0),
            }
        })
        .collect()
}

fn label(s: &Fp8Shape) -> String {
    format!(
        "{}/{}/{}/{}/{}/{}",
        s.warps[0],
        s.warps[1],
        s.depth,
        s.tall_warps,
        s.blocks_per_sm,
        u8::from(s.clusters)
    )
}

#[test]
fn gpu_fp8_products_match_the_host() {
    let Some(dev) = common::device_or_skip("gpu_fp8_products_match_the_host") else {
        return;
    };
    let mut rng = seeded_rng();
    let mut blas = Blas::new(&dev).unwrap();
    // Besides the shipped shape (through `Blas`), another: other warps a block (tall matrices'
    // too), two chunks in flight, k split over more blocks, their sums added through device
    // memory rather than in clusters.
    let other = Fp8Shape {
        warps: [4, 2],
        depth: 2,
        tall_warps: 8,
        blocks_per_sm: 3,
        clusters: false,
    };
    let mut variants: Vec<Fp8Kernels> = shapes_from_env(vec![other])
        .into_iter()
        .map(|s| Fp8Kernels::with_shape(&dev, s).unwrap())
        .collect();
    // (rows, cols): ragged row blocks, k split over blocks (1000 x 2048, 300 x 4096), k not a
    // multiple of the kernel's chunk (96: through cuBLAS at any n), and a matrix past the
    // dequantized slice (9000 x 4096 > 2^25 values: two slices), and one tall enough for the
    // tall matrices' kernel at up to 16 rows of x.
    let tall = TALL_BLOCKS_PER_SM * dev.sms * 32 + 40;
    for (rows, cols) in [
        (45, 128),
        (1000, 2048),
        (300, 4096),
        (70, 96),
        (9000, 4096),
        (tall, 256),
    ] {
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
            // Around the slices' seam, the last rows and a spread of others.
            (0..rows)
                .filter(|r| r % 97 == 0 || r.abs_diff(8192) < 40 || r + 40 >= rows)
                .collect()
        } else {
            (0..rows).collect()
        };
        for n in [1, 3, 8, 16, 17, 33, 64, 65, 130] {
            if rows * cols > 1 << 24 && n < MAX_STEP_ROWS {
                continue;
            }
            for accumulate in [false, true] {
                let mut x = random_bf16(&mut rng, n * cols, 2.0);
                // Past f16's range unscaled, and below its normal range once scaled; and a row
                // of only small values (f16 subnormals once scaled), checked against its own
                // magnitude.
                x[0] = bf16::from_f32(1.5e5);
                x[1] = bf16::from_f32(-3e-5);
                if n > 1 {
                    let small = random_bf16(&mut rng, cols, 2e-3);
                    x[cols..2 * cols].copy_from_slice(&small);
                }
                let init: Vec<f32> = (0..n * rows).map(|_| rng.random::<f32>() - 0.5).collect();
                let input = Fp8Kernels::input_for(n, cols);
                let (xd, x) = stored(&dev, &x, input);
                let tensor_cores = n <= MAX_STEP_ROWS && cols % 64 == 0;
                assert_eq!(input == Input::F16Scaled, tensor_cores);
                // cuBLAS multiplies the weights rounded to bf16 (8 significant bits).
                let tol = if tensor_cores { 1e-4 } else { 4e-3 };
                let Matrix::Fp8(fm) = &m else {
                    unreachable!("quantized above")
                };
                // The shipped shape, then the others where the tensor cores take the product.
                let runs = if tensor_cores { 1 + variants.len() } else { 1 };
                for v in 0..runs {
                    let mut product = |out: &mut _| {
                        if v == 0 {
                            blas.matmul(&dev, &xd, input, n, &m, out, accumulate)
                        } else {
                            variants[v - 1].matmul(
                                &dev,
                                blas.cublas(),
                                &xd,
                                input,
                                n,
                                fm,
                                out,
                                accumulate,
                            )
                        }
                    };
                    let mut out = dev.stream.clone_htod(&init).unwrap();
                    product(&mut out).unwrap();
                    let got = dev.stream.clone_dtoh(&out).unwrap();
                    let shape = if v == 0 {
                        "shipped".to_string()
                    } else {
                        label(&shapes_from_env(vec![other])[v - 1])
                    };
                    let what =
                        format!("{rows}x{cols}, {n} rows, accumulate {accumulate}, shape {shape}");
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
                    // Split blocks reset their counters: the same product again is the same,
                    // bit for bit.
                    let mut again = dev.stream.clone_htod(&init).unwrap();
                    product(&mut again).unwrap();
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
}

/// A row tile's split blocks give the same sums, bit for bit, whether they add them as one
/// cluster or through device memory: at every split count from 2 to one past a cluster's most
/// (device memory then), for the kernels of few and of many rows of x, accumulating or not, with
/// the last row tile cut short; splits past the most blocks the driver runs as one cluster go
/// through device memory too. The sums are the same by design, so this cannot see whether the
/// clusters ran; the product speed test shows them at work (BENCHMARKS.md, twenty-first pass).
#[test]
fn gpu_fp8_split_sums_are_the_same_in_clusters() {
    let Some(dev) = common::device_or_skip("gpu_fp8_split_sums_are_the_same_in_clusters") else {
        return;
    };
    let mut rng = seeded_rng();
    let mut blas = Blas::new(&dev).unwrap();
    let shape = Fp8Shape {
        clusters: true,
        ..Fp8Shape::default()
    };
    let mut clustered = Fp8Kernels::with_shape(&dev, shape).unwrap();
    // The driver lets every product form clusters where the device has them.
    let most = clustered.cluster_most();
    eprintln!("clusters of at most {most:?} blocks");
    assert!(
        most.iter()
            .all(|&m| m.is_power_of_two() && m as usize <= MAX_CLUSTER && (m > 1) == dev.clusters),
        "clusters of {most:?} blocks"
    );
    let mut plain = Fp8Kernels::with_shape(
        &dev,
        Fp8Shape {
            clusters: false,
            ..shape
        },
    )
    .unwrap();
    let cols = 4096;
    let target = shape.blocks_per_sm * dev.sms;
    let mut splits_seen = Vec::new();
    for want in 2..=MAX_CLUSTER + 1 {
        // target / want row blocks split k `want` ways, where k allows (see `Plan::new`).
        let rows = 32 * (target / want).max(1) - 5;
        let w = GpuMatrix {
            data: dev
                .stream
                .clone_htod(&random_bf16(&mut rng, rows * cols, 0.05))
                .unwrap(),
            rows,
            cols,
        };
        let m = blas.fp8(&dev).unwrap().quantize(&dev, &w).unwrap();
        for n in [1, 9, 16, 24, 64] {
            let splits = clustered.plan(n, rows, cols).splits;
            splits_seen.push(splits);
            let input = Fp8Kernels::input_for(n, cols);
            let (x, _) = stored(&dev, &random_bf16(&mut rng, n * cols, 1.0), input);
            let init: Vec<f32> = (0..n * rows).map(|_| rng.random::<f32>() - 0.5).collect();
            for accumulate in [false, true] {
                let run = |k: &mut Fp8Kernels| {
                    let mut out = dev.stream.clone_htod(&init).unwrap();
                    k.matmul(&dev, blas.cublas(), &x, input, n, &m, &mut out, accumulate)
                        .unwrap();
                    dev.stream.clone_dtoh(&out).unwrap()
                };
                let (a, b) = (run(&mut clustered), run(&mut plain));
                assert!(
                    a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
                    "{rows} x {cols}, {n} rows of x, {splits} splits, accumulate {accumulate}: \
                     the sums differ"
                );
            }
        }
    }
    // `plans_split_each_cluster_size` (a unit test) shows these shapes reach every split count
    // on such devices.
    if target >= 90 {
        for want in 2..=MAX_CLUSTER {
            assert!(splits_seen.contains(&want), "splits seen: {splits_seen:?}");
        }
        assert!(
            splits_seen.iter().any(|&s| s > MAX_CLUSTER),
            "{splits_seen:?}"
        );
    }
}

/// A product given x stored otherwise than it takes it is an error, not a wrong result.
#[test]
fn gpu_fp8_products_check_how_x_is_stored() {
    let Some(dev) = common::device_or_skip("gpu_fp8_products_check_how_x_is_stored") else {
        return;
    };
    let mut blas = Blas::new(&dev).unwrap();
    let (rows, cols) = (64, 128);
    let w = GpuMatrix {
        data: dev.stream.alloc_zeros::<bf16>(rows * cols).unwrap(),
        rows,
        cols,
    };
    let fp8 = Matrix::Fp8(blas.fp8(&dev).unwrap().quantize(&dev, &w).unwrap());
    let bf = Matrix::Bf16(w);
    let x = dev.stream.alloc_zeros::<bf16>(100 * cols).unwrap();
    let mut out = dev.stream.alloc_zeros::<f32>(100 * rows).unwrap();
    for (n, m, input) in [
        (16, &fp8, Input::Bf16),
        (100, &fp8, Input::F16Scaled),
        (16, &bf, Input::F16Scaled),
    ] {
        assert_ne!(Blas::input_for(n, m), input);
        let err = blas.matmul(&dev, &x, input, n, m, &mut out, false);
        assert!(err.is_err(), "{n} rows, {input:?}: accepted");
    }
    for (n, m) in [(16, &fp8), (100, &fp8), (16, &bf)] {
        let input = Blas::input_for(n, m);
        blas.matmul(&dev, &x, input, n, m, &mut out, false).unwrap();
    }
}

/// Times the products of Qwen3-8B's and Qwen3-1.7B's matrices at 16 and 64 rows, alone and as
/// a layer's four in a row (q|k|v, o, gate|up, down: one event a layer, so that each product
/// launches as a dependent of the one ahead, as in a step): fp8 on the tensor cores (each shape
/// of `VORTEX_FP8_SHAPES`, default the shipped one) against bf16 through cuBLAS, each run over
/// copies of the matrices that together exceed L2 twice over. Prints microseconds and weight
/// bytes a second.
#[test]
#[ignore]
fn gpu_fp8_product_speed() {
    use vortex_cuda::timing::{median, time_runs};
    let Some(dev) = common::device_or_skip("gpu_fp8_product_speed") else {
        return;
    };
    let shapes = shapes_from_env(vec![Fp8Shape::default()]);
    let mut blas = Blas::new(&dev).unwrap();
    // A model's name and its four products: (name, rows, cols).
    type Layer = [(&'static str, usize, usize); 4];
    let models: [(&str, Layer); 2] = [
        (
            "8B",
            [
                ("qkv", 6144, 4096),
                ("o", 4096, 4096),
                ("gate|up", 24576, 4096),
                ("down", 4096, 12288),
            ],
        ),
        (
            "1.7B",
            [
                ("qkv", 4096, 2048),
                ("o", 2048, 2048),
                ("gate|up", 12288, 2048),
                ("down", 2048, 6144),
            ],
        ),
    ];
    let mut kernels: Vec<Fp8Kernels> = shapes
        .iter()
        .map(|&s| Fp8Kernels::with_shape(&dev, s).unwrap())
        .collect();
    println!(
        "{:<14} {:>3} {:>12} fp8 by shape (warps few/many/depth: us, GB/s of weights)",
        "matrix", "n", "bf16 cuBLAS"
    );
    let layer_bytes = |m: &[(&str, usize, usize); 4], per: usize| -> usize {
        m.iter().map(|&(_, r, c)| r * c * per).sum()
    };
    for (model, mats) in &models {
        let copies = (200usize << 20).div_ceil(layer_bytes(mats, 1)).max(2);
        // copies[i][j]: matrix j of layer copy i.
        let bf: Vec<Vec<Matrix>> = (0..copies)
            .map(|_| {
                mats.iter()
                    .map(|&(_, rows, cols)| {
                        Matrix::Bf16(GpuMatrix {
                            data: dev.stream.alloc_zeros::<bf16>(rows * cols).unwrap(),
                            rows,
                            cols,
                        })
                    })
                    .collect()
            })
            .collect();
        let fp: Vec<Vec<Matrix>> = bf
            .iter()
            .map(|layer| {
                layer
                    .iter()
                    .map(|m| {
                        let Matrix::Bf16(g) = m else { unreachable!() };
                        Matrix::Fp8(blas.fp8(&dev).unwrap().quantize(&dev, g).unwrap())
                    })
                    .collect()
            })
            .collect();
        for k in &mut kernels {
            for &(_, rows, cols) in mats {
                k.reserve(&dev, rows, cols).unwrap();
            }
        }
        for n in [16, 64] {
            let widest = mats.iter().map(|m| m.1.max(m.2)).max().unwrap();
            let x = dev.stream.alloc_zeros::<bf16>(n * widest).unwrap();
            let mut out = dev.stream.alloc_zeros::<f32>(n * widest).unwrap();
            let mut i = 0;
            // One product (j < 4) or the layer's four (j = 4), over the copies in turn.
            let mut time_products =
                |j: usize,
                 run: &mut dyn FnMut(&Matrix, &Matrix) -> Result<(), vortex_cuda::CudaError>|
                 -> f64 {
                    median(
                        &time_runs(&dev, 3, 30, || {
                            i += 1;
                            let c = i % copies;
                            for jj in 0..4 {
                                if j == 4 || j == jj {
                                    run(&bf[c][jj], &fp[c][jj])?;
                                }
                            }
                            Ok(())
                        })
                        .unwrap(),
                    ) * 1e3
                };
            for j in 0..5 {
                let (name, elems) = if j < 4 {
                    (mats[j].0, mats[j].1 * mats[j].2)
                } else {
                    ("layer", layer_bytes(mats, 1))
                };
                let bf_us = time_products(j, &mut |b, _| {
                    blas.matmul(&dev, &x, Input::Bf16, n, b, &mut out, false)
                });
                let mut line = format!(
                    "{:<14} {n:>3} {bf_us:>7.1} {:>4.0}",
                    format!("{model} {name}"),
                    (elems * 2) as f64 / bf_us / 1e3
                );
                for (shape, k) in shapes.iter().zip(&mut kernels) {
                    let us = time_products(j, &mut |_, f| {
                        let Matrix::Fp8(m) = f else { unreachable!() };
                        let input = Fp8Kernels::input_for(n, m.cols);
                        k.matmul(&dev, blas.cublas(), &x, input, n, m, &mut out, false)
                    });
                    line += &format!(
                        " | {}: {us:>6.1} {:>4.0}",
                        label(shape),
                        elems as f64 / us / 1e3
                    );
                }
                println!("{line}");
            }
        }
    }
}
