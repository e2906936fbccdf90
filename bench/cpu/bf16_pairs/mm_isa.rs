//! bf16 products with and without bf16 pairs on this CPU: `mm_isa SHAPES TOKENS`, e.g.
//! `mm_isa 8960x1536,1536x8960 1,16,512`. Random bf16 weights; each line the best of 7 calls
//! (of 41 below 512 tokens) after one warm-up, the two ways alternated twice.
use std::time::Instant;
use vortex_kernels::quant::{GgmlType, Isa, QMatrix, matmul_with};

fn main() {
    let mut args = std::env::args().skip(1);
    let shapes: Vec<(usize, usize)> = args
        .next()
        .expect("SHAPES")
        .split(',')
        .map(|s| {
            let (r, c) = s.split_once('x').unwrap();
            (r.parse().unwrap(), c.parse().unwrap())
        })
        .collect();
    let tokens: Vec<usize> = args
        .next()
        .expect("TOKENS")
        .split(',')
        .map(|n| n.parse().unwrap())
        .collect();
    let plain = Isa::detect();
    let plain = Isa::with_level(plain.level()).unwrap();
    let Some(pairs) = plain.with_bf16_pairs() else {
        println!("no AVX-512 BF16 here");
        return;
    };
    println!(
        "level {:?}, threads {}",
        plain.level(),
        rayon::current_num_threads()
    );
    for &n in &tokens {
        for &(rows, cols) in &shapes {
            let mut s = 12345u64;
            let data: Vec<u8> = (0..rows * cols)
                .flat_map(|_| {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    half::bf16::from_f32(((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5)
                        .to_le_bytes()
                })
                .collect();
            let w = QMatrix::new(GgmlType::BF16, rows, cols, &data).unwrap();
            let x: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 500.0)
                .collect();
            let mut out = vec![0f32; n * rows];
            let iters = if n >= 512 { 7 } else { 41 };
            for round in 0..2 {
                for (name, isa) in [("f32  ", plain), ("pairs", pairs)] {
                    matmul_with(isa, &w, &x, n, &mut out).unwrap();
                    let mut best = f64::MAX;
                    for _ in 0..iters {
                        let t = Instant::now();
                        matmul_with(isa, &w, &x, n, &mut out).unwrap();
                        best = best.min(t.elapsed().as_secs_f64());
                    }
                    let gops = 2.0 * (rows * cols * n) as f64 / best / 1e9;
                    println!(
                        "round {round} {name} {rows}x{cols} n={n}: {:.3} ms, {gops:.1} GOP/s",
                        best * 1e3
                    );
                }
            }
        }
    }
}
