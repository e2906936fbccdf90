//! The scratch timing of `quant::matmul` behind BENCHMARKS.md "Prefill products: calls of 8
//! tokens" (`bench/cpu/matmul_calls/`, run before the groups existed, so without `ROW_GROUPS`
//! and the difference column) and "K-quant rows in groups of eight". Copy to
//! `crates/kernels/examples/mm.rs`, then, with each build to compare:
//!
//!   cargo run --release -p vortex-kernels --example mm -- TYPES SHAPES TOKENS
//!
//! e.g. `-- Q5_0,Q4_K 4864x1024,1024x4864 16,512`. Random weights (bytes masked so every scale
//! is finite), 2 threads; best of 41 calls (of 7 at 512 tokens and more) after one warm-up.
//! With `ROW_GROUPS` set the matrix is regrouped first; each line also gives the largest
//! difference from the file layout's product.
use std::time::Instant;
use vortex_kernels::quant::{GgmlType, QMatrix, RowGroups, matmul};

fn list<T>(arg: Option<String>, parse: impl Fn(&str) -> T) -> Vec<T> {
    arg.expect("usage: mm TYPES SHAPES TOKENS").split(',').map(parse).collect()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let types = list(args.next(), |t| {
        *GgmlType::ALL.iter().find(|ty| format!("{ty:?}") == t).expect("a GGML type name")
    });
    let shapes = list(args.next(), |s| {
        let (r, c) = s.split_once('x').expect("ROWSxCOLS");
        (r.parse::<usize>().unwrap(), c.parse::<usize>().unwrap())
    });
    let tokens = list(args.next(), |n| n.parse::<usize>().unwrap());
    for ty in types {
        for &n in &tokens {
            for &(rows, cols) in &shapes {
                let Some(rb) = ty.row_bytes(cols) else { continue };
                let mut data = vec![0u8; rb * rows];
                let mut s = 12345u64;
                for b in data.iter_mut() {
                    s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    *b = (s >> 33) as u8 & 0x3b;
                }
                let w = QMatrix::new(ty, rows, cols, &data).unwrap();
                let groups = if std::env::var("ROW_GROUPS").is_ok() { RowGroups::new(&w) } else { None };
                let w = match &groups { Some(g) => w.with_groups(g).unwrap(), None => w };
                let x: Vec<f32> =
                    (0..n * cols).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 500.0).collect();
                let mut out = vec![0f32; n * rows];
                matmul(&w, &x, n, &mut out).unwrap();
                let mut plain = vec![0f32; n * rows];
                matmul(&QMatrix::new(ty, rows, cols, &data).unwrap(), &x, n, &mut plain).unwrap();
                let iters = if n >= 512 { 7 } else { 41 };
                let mut best = f64::MAX;
                for _ in 0..iters {
                    let t = Instant::now();
                    matmul(&w, &x, n, &mut out).unwrap();
                    best = best.min(t.elapsed().as_secs_f64());
                }
                let gops = 2.0 * (rows * cols * n) as f64 / best / 1e9;
                let diff = out.iter().zip(&plain).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                let scale = plain.iter().map(|v| v.abs()).fold(0f32, f32::max);
                println!("{ty:?} {rows}x{cols} n={n}: {:.3} ms, {gops:.1} GOP/s (max diff {diff:.2e} of {scale:.2e}, groups {})", best * 1e3, groups.is_some());
            }
        }
    }
}
