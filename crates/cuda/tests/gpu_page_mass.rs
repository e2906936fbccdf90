//! The exact page masses a measured decode step compares its selections with, against the CPU
//! on fresh random pools: each page's mass, and the recall of a selection against the CPU's
//! fidelity of the same selection. Skips visibly without a GPU.

mod common;
#[path = "common/random_pool.rs"]
mod random_pool;

use rand::seq::SliceRandom;
use rand::{Rng, rngs::StdRng};
use random_pool::{RandomPool, pool_values, seeded_rng};
use vortex_cuda::page_mass::{MassScratch, MeasuredRow, PageMass};
use vortex_cuda::{DeviceTable, GpuLayerKv, PoolDtype};
use vortex_eval::fidelity::row_fidelity;
use vortex_kv::{KvGeometry, LayerKv, PageTable, Sequence};

/// Each page's exact attention mass for KV head `head` of `seq`, summed over the group's query
/// heads `q` (`[group][dim]`), in f64 from the values the pool holds.
fn cpu_masses(kv: &LayerKv, seq: &Sequence, head: usize, q: &[f32], scale: f64) -> Vec<f64> {
    let g = kv.geometry();
    let (p, d) = (g.page_size, g.head_dim);
    let mut block = vec![0f32; p * d];
    let mut logits: Vec<Vec<(usize, f64)>> = vec![Vec::new(); q.len() / d];
    for (i, &page) in seq.pages.iter().enumerate() {
        kv.k.read_f32(kv.head_offset(page, head), &mut block);
        let tokens = if i + 1 == seq.pages.len() {
            seq.last_page_len(p)
        } else {
            p
        };
        for (h, row) in logits.iter_mut().enumerate() {
            for t in 0..tokens {
                let dot: f64 = (0..d)
                    .map(|j| f64::from(q[h * d + j]) * f64::from(block[t * d + j]))
                    .sum();
                row.push((i, dot * scale));
            }
        }
    }
    let mut mass = vec![0f64; seq.pages.len()];
    for row in &logits {
        let max = row.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = row.iter().map(|x| (x.1 - max).exp()).sum();
        for &(i, s) in row {
            mass[i] += (s - max).exp() / z;
        }
    }
    mass
}

#[test]
fn page_masses_and_recall_match_the_cpu() {
    let Some(dev) = common::device_or_skip("page_masses_and_recall_match_the_cpu") else {
        return;
    };
    let mut rng: StdRng = seeded_rng();
    // (query heads, KV heads, head dim, page, sequence lengths): rows of several blocks'
    // chunks, a last page part full, a one-token sequence, groups of 1 to 16; head_dim 128 in
    // pages of 16 with up to 8 query heads per KV head scores on the tensor cores (the first
    // three cases, bf16 from compute capability 8.0, fp8 from 8.9).
    // The last: rows of more pages and more kept than the recall holds in shared memory.
    let cases: [(usize, usize, usize, usize, &[usize]); 8] = [
        (32, 8, 128, 16, &[3000, 17, 1024, 333]),
        (64, 8, 128, 16, &[2100, 16]),
        (3, 3, 128, 16, &[4500, 1]),
        (8, 2, 64, 8, &[5000, 9, 1]),
        (16, 1, 128, 16, &[2500, 40]),
        (4, 2, 16, 64, &[700, 65]),
        (3, 3, 64, 4, &[900, 5]),
        (4, 2, 16, 1, &[9000, 300]),
    ];
    let mut batched = false;
    for dtype in [PoolDtype::Bf16, PoolDtype::Fp8] {
        for &(heads_q, kv_heads, dim, page, lens) in &cases {
            let geom = KvGeometry::new(kv_heads, dim, page).unwrap();
            let group = heads_q / kv_heads;
            let pool = RandomPool::new(&mut rng, geom, lens);
            let held = pool_values(&pool.layer, dtype);
            let gpu_kv = GpuLayerKv::upload(&dev, &pool.layer, dtype).unwrap();
            let seqs: Vec<&Sequence> = pool.seqs.iter().collect();
            let dense = DeviceTable::upload(
                &dev,
                &PageTable::dense(&seqs, page),
                kv_heads,
                page,
                pool.pages,
            )
            .unwrap();
            // Queries large enough that the masses gather on a few pages.
            let q: Vec<f32> = (0..seqs.len() * heads_q * dim)
                .map(|_| (rng.random::<f32>() * 2.0 - 1.0) * 4.0)
                .collect();
            let dq = dev.stream.clone_htod(&q).unwrap();
            let scale = 1.0 / (dim as f32).sqrt();
            let mut pairs: Vec<(u32, u32)> = (0..seqs.len() as u32)
                .flat_map(|s| (0..kv_heads as u32).map(move |h| (s, h)))
                .collect();
            pairs.shuffle(&mut rng);
            pairs.truncate(pairs.len() - pairs.len() / 4);
            // Each row keeps a random third of its pages (at least one), listed in a shuffled
            // order as an index phase may write them.
            let (mut rows, mut kept_ids, mut kept_flags) = (Vec::new(), Vec::new(), Vec::new());
            for &(s, h) in &pairs {
                let seq = seqs[s as usize];
                let mut kept: Vec<bool> = (0..seq.pages.len())
                    .map(|_| rng.random::<f32>() < 0.33)
                    .collect();
                let one = rng.random_range(0..kept.len());
                kept[one] = true;
                let mut ids: Vec<u32> = seq
                    .pages
                    .iter()
                    .zip(&kept)
                    .filter(|(_, k)| **k)
                    .map(|(&p, _)| p)
                    .collect();
                ids.shuffle(&mut rng);
                rows.push(MeasuredRow {
                    seq: s,
                    head: h,
                    kept_at: kept_ids.len() as u32,
                    kept: ids.len() as u32,
                });
                kept_ids.extend(ids);
                kept_flags.push(kept);
            }
            let sparse = dev.stream.clone_htod(&kept_ids).unwrap();
            let mut recall = dev.stream.alloc_zeros::<f32>(2 * rows.len()).unwrap();
            let kernels = PageMass::new(&dev, geom, dtype, group).unwrap();
            // Small enough that the longest rows go in several batches.
            let mut scratch = MassScratch::with_budget(256 << 10);
            let stride = kernels
                .measure(
                    &dev,
                    &gpu_kv,
                    &dense,
                    &dq,
                    scale,
                    &sparse,
                    &rows,
                    &mut scratch,
                    &mut recall.slice_mut(..),
                )
                .unwrap();
            // The masses of the last batch are left to read.
            let (last, masses) = scratch.masses(&dev).unwrap();
            batched |= last > 0;
            let recall = dev.stream.clone_dtoh(&recall).unwrap();
            let at = format!("{dtype} {heads_q}/{kv_heads}x{dim} page {page}");
            for (r, row) in rows.iter().enumerate() {
                let (s, h) = (row.seq as usize, row.head as usize);
                let seq = seqs[s];
                let qg = &q[(s * heads_q + h * group) * dim..][..group * dim];
                let want = cpu_masses(&held, seq, h, qg, f64::from(scale));
                if r >= last {
                    let mass = &masses[(r - last) * stride..][..seq.pages.len()];
                    for (i, (&g, &w)) in mass.iter().zip(&want).enumerate() {
                        assert!(
                            (f64::from(g) - w).abs() <= 1e-5 + 2e-4 * w,
                            "{at}: sequence {s} head {h} page {i}: {g} against {w}"
                        );
                    }
                }
                let ids = &kept_ids[row.kept_at as usize..][..row.kept as usize];
                let out = vec![1f32; group * dim];
                let cpu = row_fidelity(&held, seq, h, ids, qg, &out, scale);
                let (mass_recall, topk_recall) = (recall[2 * r], recall[2 * r + 1]);
                assert!(
                    (f64::from(mass_recall) - cpu.mass_recall).abs() < 1e-4,
                    "{at}: sequence {s} head {h}: mass recall {mass_recall} against {}",
                    cpu.mass_recall
                );
                // Pages whose masses tie to f32's precision at the k-th may rank either way;
                // elsewhere the share is the CPU's.
                let k = kept_flags[r].iter().filter(|k| **k).count();
                let mut sorted = want.clone();
                sorted.sort_by(|a, b| b.total_cmp(a));
                let tied = sorted
                    .get(k)
                    .is_some_and(|&next| sorted[k - 1] - next <= 1e-6 + 1e-4 * sorted[k - 1]);
                let slack = if tied { 1.0 / k as f64 } else { 0.0 };
                assert!(
                    (f64::from(topk_recall) - cpu.topk_recall).abs() <= slack + 1e-6,
                    "{at}: sequence {s} head {h}: top-k recall {topk_recall} against {}",
                    cpu.topk_recall
                );
            }
        }
    }
    assert!(batched, "no case measured its rows in more than one batch");
}

/// What measuring a layer costs: batch 16 of Qwen3-8B's attention shape (8 KV heads, 4 query
/// heads each, head_dim 128, pages of 16), each row keeping 128 pages; against reading the
/// layer's keys once at the copy bandwidth. `--ignored`.
#[test]
#[ignore]
fn page_mass_speed() {
    let Some(dev) = common::device_or_skip("page_mass_speed") else {
        return;
    };
    let mut rng: StdRng = seeded_rng();
    let (batch, kv_heads, group, dim, page, keep) = (16usize, 8usize, 4usize, 128usize, 16, 128);
    let geom = KvGeometry::new(kv_heads, dim, page).unwrap();
    let copy = vortex_cuda::timing::copy_bandwidth(&dev, 1 << 30, 20).unwrap();
    println!("copy bandwidth {copy:.0} GB/s (read and written)");
    for context in [8192usize, 32_768] {
        let pool = RandomPool::new(&mut rng, geom, &vec![context; batch]);
        let gpu_kv = GpuLayerKv::upload(&dev, &pool.layer, PoolDtype::Bf16).unwrap();
        let seqs: Vec<&Sequence> = pool.seqs.iter().collect();
        let table = PageTable::dense(&seqs, page);
        let dense = DeviceTable::upload(&dev, &table, kv_heads, page, pool.pages).unwrap();
        let q: Vec<f32> = (0..batch * kv_heads * group * dim)
            .map(|_| rng.random::<f32>() * 2.0 - 1.0)
            .collect();
        let dq = dev.stream.clone_htod(&q).unwrap();
        let (mut rows, mut ids) = (Vec::new(), Vec::new());
        for (s, seq) in seqs.iter().enumerate() {
            for h in 0..kv_heads {
                rows.push(MeasuredRow {
                    seq: s as u32,
                    head: h as u32,
                    kept_at: ids.len() as u32,
                    kept: keep as u32,
                });
                let mut pages = seq.pages.clone();
                pages.shuffle(&mut rng);
                ids.extend(&pages[..keep]);
            }
        }
        let sparse = dev.stream.clone_htod(&ids).unwrap();
        let mut recall = dev.stream.alloc_zeros::<f32>(2 * rows.len()).unwrap();
        let kernels = PageMass::new(&dev, geom, PoolDtype::Bf16, group).unwrap();
        let mut scratch = MassScratch::default();
        let ms = vortex_cuda::timing::time_runs(&dev, 3, 20, || {
            let out = &mut recall.slice_mut(..);
            let s = &mut scratch;
            kernels.measure(&dev, &gpu_kv, &dense, &dq, 0.1, &sparse, &rows, s, out)?;
            Ok(())
        })
        .unwrap();
        let us = vortex_cuda::timing::median(&ms) * 1e3;
        let key_bytes = (batch * context * kv_heads * dim * 2) as f64;
        let floor = key_bytes / (copy * 1e9) * 1e6;
        println!(
            "context {context}: {us:.1} us a layer; its keys ({:.0} MB) read once at the copy \
             bandwidth take {floor:.1} us",
            key_bytes / 1e6
        );
    }
}
