//! Causal prefill attention on the GPU against the CPU's on fresh random pools: chunks that
//! start mid-sequence, tiles cut short, shuffled pages, one to sixteen query heads per KV head,
//! bf16 and fp8 pools, the tensor-core kernel and the f32 one, with and without a sliding
//! window. Skips visibly without a GPU.

mod common;
#[path = "common/random_pool.rs"]
mod random_pool;

use rand::Rng;
use rand::seq::SliceRandom;
use random_pool::{pool_values, random_layer, seeded_rng};
use vortex_cuda::prefill::{PrefillAttention, PrefillSeq, on_tensor_cores, tiles};
use vortex_cuda::{DeviceTable, GpuLayerKv, PoolDtype};
use vortex_kernels::prefill::prefill_attention_with;
use vortex_kernels::simd::Simd;
use vortex_kv::{KvGeometry, PageTable};

/// Relative error (L2, per output row) allowed: the tensor-core kernel rounds queries and
/// softmax weights to bf16.
const TOLERANCE: f32 = 0.02;

#[test]
fn gpu_prefill_matches_the_cpu() {
    let Some(dev) = common::device_or_skip("gpu_prefill_matches_the_cpu") else {
        return;
    };
    let mut rng = seeded_rng();
    // (KV heads, head_dim, page size, query heads per KV head)
    for (kv_heads, dim, page, group) in [
        (2, 128, 16, 4),
        (3, 64, 16, 3),
        (1, 128, 16, 8),
        (2, 128, 16, 1),
        (1, 128, 16, 16),
        (2, 64, 1, 2),
        (2, 96, 16, 2),
        (2, 80, 16, 2),
        (2, 256, 16, 2),
    ] {
        let geom = KvGeometry::new(kv_heads, dim, page).unwrap();
        let heads_q = kv_heads * group;
        // (tokens already cached, new tokens) of each sequence.
        let shapes = [(150, 150), (0, 77), (40, 1), (0, 200), (13, 64)];
        let lens: Vec<usize> = shapes.iter().map(|&(s, n)| s + n).collect();
        let num_pages = lens.iter().map(|l| l.div_ceil(page)).sum::<usize>() + 2;
        let mut ids: Vec<u32> = (0..num_pages as u32).collect();
        ids.shuffle(&mut rng);
        let mut table = PageTable::new(1);
        let mut seq_pages = Vec::new();
        let mut seqs = Vec::new();
        let mut first_row = 0;
        for (i, (&(start, tokens), &len)) in shapes.iter().zip(&lens).enumerate() {
            let pages: Vec<u32> = ids.drain(..len.div_ceil(page)).collect();
            table.push_row(&pages, len - (pages.len() - 1) * page);
            seq_pages.push(pages);
            seqs.push(PrefillSeq {
                first_row,
                tokens,
                start,
                table_row: i,
            });
            first_row += tokens;
        }
        let width = heads_q * dim;
        let q: Vec<f32> = (0..first_row * width)
            .map(|_| (rng.random::<f32>() * 2.0 - 1.0) * 3.0)
            .collect();
        let scale = 1.0 / (dim as f32).sqrt();
        let layer = random_layer(&mut rng, geom, num_pages);
        // No window; each token alone; a window shorter than most pasts and crossing tiles.
        let cases = [PoolDtype::Bf16, PoolDtype::Fp8]
            .into_iter()
            .flat_map(|d| [None, Some(1), Some(37)].map(|w| (d, w)));
        for (dtype, window) in cases {
            let cpu_layer = pool_values(&layer, dtype);
            let mut want = vec![0.0f32; q.len()];
            for (s, pages) in seqs.iter().zip(&seq_pages) {
                let rows = s.first_row * width..(s.first_row + s.tokens) * width;
                prefill_attention_with(
                    Simd::detect(),
                    window,
                    &cpu_layer,
                    pages,
                    s.start,
                    &q[rows.clone()],
                    heads_q,
                    scale,
                    &mut want[rows],
                )
                .unwrap();
            }
            let gpu_layer = GpuLayerKv::upload(&dev, &layer, dtype).unwrap();
            let dt = DeviceTable::upload(&dev, &table, kv_heads, page, num_pages).unwrap();
            let attn = PrefillAttention::new(&dev, geom, dtype, heads_q).unwrap();
            let t: Vec<i32> = tiles(&seqs, attn.tile_tokens).concat();
            let t = dev.stream.clone_htod(&t).unwrap();
            let qd = dev.stream.clone_htod(&q).unwrap();
            let mut out = dev.stream.alloc_zeros::<f32>(q.len()).unwrap();
            attn.run(
                &dev, &gpu_layer, &dt, &seqs, &t, &qd, scale, window, &mut out,
            )
            .unwrap();
            let got = dev.stream.clone_dtoh(&out).unwrap();
            let mut worst = 0.0f32;
            for (g, w) in got.chunks(dim).zip(want.chunks(dim)) {
                let diff: f32 = g.iter().zip(w).map(|(a, b)| (a - b).powi(2)).sum();
                let norm: f32 = w.iter().map(|b| b * b).sum();
                worst = worst.max((diff / norm.max(1e-12)).sqrt());
            }
            let mma = on_tensor_cores(dim, group, dev.capability);
            eprintln!(
                "{kv_heads} KV heads x {group}, dim {dim}, page {page}, {dtype}, window {window:?}, tensor cores {mma}: worst row error {worst:.2e}"
            );
            assert!(worst < TOLERANCE, "{worst}");
        }
    }
}

#[test]
fn gpu_prefill_a_later_nonfinite_value_leaves_earlier_rows_alone() {
    let Some(dev) =
        common::device_or_skip("gpu_prefill_a_later_nonfinite_value_leaves_earlier_rows_alone")
    else {
        return;
    };
    let mut rng = seeded_rng();
    // (head_dim, query heads per KV head): the tensor-core kernel, then the f32 one.
    for (dim, group) in [(128, 4), (80, 2)] {
        // (page, cached tokens, new tokens, position of the bad value): the value in the
        // block's first key tile, in a later block's diagonal tile, and after a long past.
        for (page, cached, tokens, bad) in [(16, 0, 40, 30), (16, 3, 100, 70), (4, 300, 20, 310)] {
            let kv_heads = 2;
            let geom = KvGeometry::new(kv_heads, dim, page).unwrap();
            let heads_q = kv_heads * group;
            let len: usize = cached + tokens;
            let pages: Vec<u32> = (0..len.div_ceil(page) as u32).rev().collect();
            let mut table = PageTable::new(1);
            table.push_row(&pages, len - (pages.len() - 1) * page);
            let seqs = [PrefillSeq {
                first_row: 0,
                tokens,
                start: cached,
                table_row: 0,
            }];
            let width = heads_q * dim;
            let q: Vec<f32> = (0..tokens * width)
                .map(|_| rng.random::<f32>() * 2.0 - 1.0)
                .collect();
            let scale = 1.0 / (dim as f32).sqrt();
            let clean = random_layer(&mut rng, geom, pages.len());
            let mut layer = clean.clone();
            // KV head 0 gets an infinity, head 1 a NaN, in dimension 3 of the bad token.
            for (h, x) in [(0, f32::INFINITY), (1, f32::NAN)] {
                let at = layer.head_offset(pages[bad / page], h) + (bad % page) * dim;
                layer.v.write_f32(at + 3, &[x]);
            }
            // With a window of 9, rows 9 or more past the bad value no longer see it.
            let cases = [PoolDtype::Bf16, PoolDtype::Fp8]
                .into_iter()
                .flat_map(|d| [None, Some(9)].map(|w| (d, w)));
            for (dtype, window) in cases {
                let mut want = vec![0.0f32; q.len()];
                prefill_attention_with(
                    Simd::detect(),
                    window,
                    &pool_values(&clean, dtype),
                    &pages,
                    cached,
                    &q,
                    heads_q,
                    scale,
                    &mut want,
                )
                .unwrap();
                let gpu_layer = GpuLayerKv::upload(&dev, &layer, dtype).unwrap();
                let dt = DeviceTable::upload(&dev, &table, kv_heads, page, pages.len()).unwrap();
                let attn = PrefillAttention::new(&dev, geom, dtype, heads_q).unwrap();
                let t: Vec<i32> = tiles(&seqs, attn.tile_tokens).concat();
                let t = dev.stream.clone_htod(&t).unwrap();
                let qd = dev.stream.clone_htod(&q).unwrap();
                let mut out = dev.stream.alloc_zeros::<f32>(q.len()).unwrap();
                attn.run(
                    &dev, &gpu_layer, &dt, &seqs, &t, &qd, scale, window, &mut out,
                )
                .unwrap();
                let got = dev.stream.clone_dtoh(&out).unwrap();
                let case = format!(
                    "dim {dim} x {group}, page {page}, {cached} + {tokens}, {dtype}, window {window:?}"
                );
                let before = (bad - cached) * width;
                for (r, (g, w)) in got[..before].chunks(dim).zip(want.chunks(dim)).enumerate() {
                    let diff: f32 = g.iter().zip(w).map(|(a, b)| (a - b).powi(2)).sum();
                    let norm: f32 = w.iter().map(|b| b * b).sum();
                    let err = (diff / norm.max(1e-12)).sqrt();
                    assert!(
                        err < TOLERANCE,
                        "{case}: row {r} before the bad value: error {err}"
                    );
                }
                // The pool holds the NaN either way (an fp8 pool may saturate the infinity):
                // every later row of KV head 1's query heads that sees it shows it; rows past
                // its window are as the clean pool's.
                let rows = got[before..].chunks(dim).zip(want[before..].chunks(dim));
                for (r, (row, w)) in rows.enumerate() {
                    let (head, at) = (r % heads_q, bad + r / heads_q);
                    if window.is_some_and(|win| at >= bad + win) {
                        let diff: f32 = row.iter().zip(w).map(|(a, b)| (a - b).powi(2)).sum();
                        let norm: f32 = w.iter().map(|b| b * b).sum();
                        let err = (diff / norm.max(1e-12)).sqrt();
                        assert!(err < TOLERANCE, "{case}: row {r} past the window: {err}");
                    } else if head / group == 1 {
                        assert!(
                            !row[3].is_finite(),
                            "{case}: row {r} from the bad value on: {}",
                            row[3]
                        );
                    }
                }
            }
        }
    }
}

/// `#[ignore]`d timing: a prefill pass of 16 chunks of 2048 new tokens, each after 0, 6144 or
/// 30720 cached ones, Qwen3-8B's attention shape (8 KV heads x 4, head_dim 128), bf16 and fp8
/// pools.
/// `VORTEX_NO_MMA_PREFILL=1` times the f32 kernel instead.
#[test]
#[ignore]
fn gpu_prefill_speed() {
    let Some(dev) = common::device_or_skip("gpu_prefill_speed") else {
        return;
    };
    let mut rng = seeded_rng();
    let (kv_heads, dim, page, group) = (8, 128, 16, 4);
    let geom = KvGeometry::new(kv_heads, dim, page).unwrap();
    let heads_q = kv_heads * group;
    let chunk = 2048;
    println!("{}", dev.describe());
    println!("| pool | cached tokens | new tokens | sequences | ms | TFLOP/s |");
    println!("|---|---|---|---|---|---|");
    for (dtype, cached) in [PoolDtype::Bf16, PoolDtype::Fp8]
        .into_iter()
        .flat_map(|d| [0usize, 6144, 30720].map(|c| (d, c)))
    {
        let n_seqs = 16;
        let len = cached + chunk;
        let per_seq = len.div_ceil(page);
        let num_pages = per_seq * n_seqs;
        let mut table = PageTable::new(1);
        let mut seqs = Vec::new();
        for i in 0..n_seqs {
            let pages: Vec<u32> = (0..per_seq).map(|p| (i * per_seq + p) as u32).collect();
            table.push_row(&pages, len - (per_seq - 1) * page);
            seqs.push(PrefillSeq {
                first_row: i * chunk,
                tokens: chunk,
                start: cached,
                table_row: i,
            });
        }
        let layer = random_layer(&mut rng, geom, num_pages);
        let gpu_layer = GpuLayerKv::upload(&dev, &layer, dtype).unwrap();
        let dt = DeviceTable::upload(&dev, &table, kv_heads, page, num_pages).unwrap();
        let attn = PrefillAttention::new(&dev, geom, dtype, heads_q).unwrap();
        let t: Vec<i32> = tiles(&seqs, attn.tile_tokens).concat();
        let t = dev.stream.clone_htod(&t).unwrap();
        let rows = n_seqs * chunk * heads_q * dim;
        let q: Vec<f32> = (0..rows).map(|_| rng.random::<f32>() - 0.5).collect();
        let qd = dev.stream.clone_htod(&q).unwrap();
        let mut out = dev.stream.alloc_zeros::<f32>(rows).unwrap();
        let scale = 1.0 / (dim as f32).sqrt();
        let ms = vortex_cuda::timing::time_runs(&dev, 2, 5, || {
            attn.run(&dev, &gpu_layer, &dt, &seqs, &t, &qd, scale, None, &mut out)
        })
        .unwrap();
        let ms = vortex_cuda::timing::median(&ms);
        // Two products of 2 * head_dim flops per (query head, key) pair in each row's past.
        let pairs: f64 = (0..chunk).map(|i| (cached + i + 1) as f64).sum::<f64>();
        let flops = 4.0 * dim as f64 * heads_q as f64 * pairs * n_seqs as f64;
        println!(
            "| {dtype:?} | {cached} | {chunk} | {n_seqs} | {ms:.3} | {:.1} |",
            flops / ms / 1e9
        );
    }
}
