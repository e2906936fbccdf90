//! GPU kernels against the CPU backend on fresh random inputs. Each test prints why it is
//! skipped where there is no CUDA device.

mod common;
#[path = "common/random_pool.rs"]
mod random_pool;

use half::bf16;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng, rngs::StdRng};
use random_pool::{pool_values, random_layer};
use vortex_cuda::attention::{self, AttnOut, Variant};
use vortex_cuda::blas::Input;
use vortex_cuda::layer_kernels::LayerKernels;
use vortex_cuda::step_attention;
use vortex_cuda::{DecodeAttention, Device, DeviceTable, GpuLayerKv, KvKernels, PoolDtype};
use vortex_kernels::attention::decode_attention;
use vortex_kv::{KvGeometry, LayerKv, PageTable, Storage};

fn f32_bits(s: &Storage) -> Vec<u32> {
    let mut v = vec![0.0f32; s.len()];
    s.read_f32(0, &mut v);
    v.iter().map(|x| x.to_bits()).collect()
}

/// Tokens appended to a random pool land bit for bit where the CPU writes them, rounded as the
/// pool rounds (fp8: past +-448 saturated, subnormals and ties all occur at these scales).
#[test]
fn kv_append_matches_cpu_writes() {
    let Some(dev) = common::device_or_skip("kv_append_matches_cpu_writes") else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(common::test_seed());
    let draw = |dtype: PoolDtype, rng: &mut StdRng| match dtype {
        PoolDtype::Bf16 => rng.random::<f32>() * 8.0 - 4.0,
        PoolDtype::Fp8 if rng.random::<f32>() < 0.05 => {
            600.0 * (rng.random::<f32>() - 0.5).signum()
        }
        PoolDtype::Fp8 => {
            (rng.random::<f32>() * 2.0 - 1.0) * 10f32.powf(rng.random::<f32>() * 6.0 - 3.5)
        }
    };
    for dtype in [PoolDtype::Bf16, PoolDtype::Fp8] {
        for (kv_heads, dim, page) in [(8, 128, 16), (2, 64, 1), (3, 256, 32)] {
            let geom = KvGeometry::new(kv_heads, dim, page).unwrap();
            let pages = 37;
            let mut cpu = pool_values(&random_layer(&mut rng, geom, pages), dtype);
            let mut gpu = GpuLayerKv::upload(&dev, &cpu, dtype).unwrap();
            let kernels = KvKernels::new(&dev, geom, dtype).unwrap();
            let mut all: Vec<(u32, u32)> = (0..pages as u32)
                .flat_map(|p| (0..page as u32).map(move |s| (p, s)))
                .collect();
            all.shuffle(&mut rng);
            let slots = &all[..all.len().min(300)];
            let width = kv_heads * dim;
            let k: Vec<f32> = (0..slots.len() * width)
                .map(|_| draw(dtype, &mut rng))
                .collect();
            let v: Vec<f32> = (0..slots.len() * width)
                .map(|_| draw(dtype, &mut rng))
                .collect();
            kernels.append(&dev, &mut gpu, slots, &k, &v).unwrap();
            let stored =
                |x: &[f32]| -> Vec<f32> { x.iter().map(|&x| dtype.kv_dtype().round(x)).collect() };
            for (t, &(p, s)) in slots.iter().enumerate() {
                let span = t * width..(t + 1) * width;
                cpu.write_token(p, s as usize, &stored(&k[span.clone()]), &stored(&v[span]))
                    .unwrap();
            }
            let back = gpu.download(&dev).unwrap();
            assert!(
                f32_bits(&back.k) == f32_bits(&cpu.k),
                "{dtype} keys differ for {geom:?}"
            );
            assert!(
                f32_bits(&back.v) == f32_bits(&cpu.v),
                "{dtype} values differ for {geom:?}"
            );
        }
    }
}

/// Random sequences over shuffled pages: their lengths in tokens and page lists.
fn random_seqs(
    rng: &mut StdRng,
    lens: &[usize],
    page: usize,
    pool: usize,
) -> Vec<(usize, Vec<u32>)> {
    let mut free: Vec<u32> = (0..pool as u32).collect();
    free.shuffle(rng);
    lens.iter()
        .map(|&len| {
            let n = len.div_ceil(page);
            (len, free.drain(..n).collect())
        })
        .collect()
}

/// NaN in the K and V of every slot past a sequence's last token: a kernel that lets an
/// unwritten slot into its sums (even times a zero probability) gives NaN.
fn poison_tails(layer: &mut LayerKv, seqs: &[(usize, Vec<u32>)]) {
    let page = layer.geometry().page_size;
    for (len, pages) in seqs {
        poison_positions(layer, pages, *len..pages.len() * page);
    }
}

/// NaN in every KV head's keys and values at positions `span` of a sequence holding `pages`.
fn poison_positions(layer: &mut LayerKv, pages: &[u32], span: std::ops::Range<usize>) {
    let g = layer.geometry();
    let (heads, page, dim) = (g.kv_heads, g.page_size, g.head_dim);
    for store in [&mut layer.k, &mut layer.v] {
        let Storage::Bf16(v) = store else {
            panic!("random layers are bf16")
        };
        for pos in span.clone() {
            for head in 0..heads {
                let at = ((pages[pos / page] as usize * heads + head) * page + pos % page) * dim;
                v[at..at + dim].fill(half::bf16::NAN);
            }
        }
    }
}

fn dense_table(seqs: &[(usize, Vec<u32>)], page: usize) -> PageTable {
    let mut t = PageTable::new(1);
    for (len, pages) in seqs {
        t.push_row(pages, len - (pages.len() - 1) * page);
    }
    t
}

/// Per KV head, a random subset of the complete pages plus the last page.
fn sparse_table(
    rng: &mut StdRng,
    seqs: &[(usize, Vec<u32>)],
    page: usize,
    kv_heads: usize,
) -> PageTable {
    let mut t = PageTable::new(kv_heads);
    for (len, pages) in seqs {
        for _ in 0..kv_heads {
            let keep = rng.random::<f64>();
            let mut row: Vec<u32> = pages[..pages.len() - 1]
                .iter()
                .copied()
                .filter(|_| rng.random::<f64>() < keep)
                .collect();
            row.push(*pages.last().unwrap());
            t.push_row(&row, len - (pages.len() - 1) * page);
        }
    }
    t
}

fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    let den: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    (num / den).sqrt()
}

#[test]
fn decode_attention_matches_cpu() {
    let Some(dev) = common::device_or_skip("decode_attention_matches_cpu") else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(common::test_seed());
    // (heads_q, kv_heads, head_dim, page_size, sequence lengths)
    let cases: &[(usize, usize, usize, usize, &[usize])] = &[
        (32, 8, 128, 16, &[1, 17, 300, 5000, 16, 33000, 2, 4097]),
        (16, 2, 128, 16, &[70_000, 40]),
        // Seven query heads per KV head: an unused row of the tensor-core products.
        (14, 2, 128, 16, &[3000, 17, 1]),
        (8, 8, 64, 1, &[1, 9, 700]),
        // head_dim 64 on the tensor cores from a bf16 pool: Qwen2.5-0.5B's 7 query heads over
        // each KV head, and 8 (a full tile of heads).
        (14, 2, 64, 16, &[3000, 17, 1, 600]),
        (8, 1, 64, 16, &[16, 33, 2049]),
        (12, 4, 256, 64, &[1000, 65, 64, 3]),
        // Pages in two steps: Gemma 3's 4 heads over one of 256 (a token a load), and rows of
        // several tokens a load (head_dim 128 at pages of 32, 64 at pages of 64); last pages of
        // 8 tokens or fewer leave a step with none.
        (4, 1, 256, 16, &[1, 7, 8, 9, 17, 24, 3000]),
        (8, 2, 128, 32, &[1, 9, 31, 33, 500]),
        (4, 4, 64, 64, &[1, 65, 200]),
        (8, 1, 32, 8, &[123, 2048]),
        // Wider groups, split over items: 16 as 2 x 8 and 10 as 2 x 5 (tensor cores), 9 as
        // 3 x 3.
        (32, 2, 128, 16, &[3000, 17, 1, 600]),
        (20, 2, 128, 16, &[500, 9]),
        (9, 1, 64, 16, &[300, 2]),
    ];
    let variants = [
        Variant::default(),
        Variant {
            warps: 8,
            min_blocks: 1,
            prefetch: false,
        },
        Variant {
            warps: 1,
            min_blocks: 8,
            prefetch: false,
        },
        Variant {
            warps: 4,
            min_blocks: 2,
            prefetch: true,
        },
        Variant {
            warps: 1,
            min_blocks: 8,
            prefetch: true,
        },
        step_attention::ONE_ROUND,
    ];
    // fp8 pools: the CPU attends over the pool's own values; fewer builds, with and without
    // prefetching (the tensor-core page loop has both).
    let fp8_variants = [variants[0], variants[3], variants[4], variants[5]];
    let runs = [
        (PoolDtype::Bf16, &variants[..]),
        (PoolDtype::Fp8, &fp8_variants[..]),
    ];
    // Every build below compiled at once on every core, not one by one in the loops.
    let specs: Vec<_> = runs
        .iter()
        .flat_map(|&(dtype, variants)| {
            cases
                .iter()
                .flat_map(move |&(heads_q, kv_heads, dim, page, _)| {
                    let geom = KvGeometry::new(kv_heads, dim, page).unwrap();
                    (variants.iter())
                        .map(move |&v| attention::module_spec(geom, dtype, heads_q / kv_heads, v))
                })
        })
        .collect();
    vortex_cuda::compile::warm_cache(&dev, &specs).unwrap();
    for (dtype, variants) in runs {
        for &(heads_q, kv_heads, dim, page, lens) in cases {
            let geom = KvGeometry::new(kv_heads, dim, page).unwrap();
            let pool = lens.iter().map(|l| l.div_ceil(page)).sum::<usize>() + 5;
            let mut layer = random_layer(&mut rng, geom, pool);
            let seqs = random_seqs(&mut rng, lens, page, pool);
            poison_tails(&mut layer, &seqs);
            let gpu_layer = GpuLayerKv::upload(&dev, &layer, dtype).unwrap();
            // The CPU attends over an f32 copy of the pool's values: over a bf16 pool it would
            // round the queries and weights to bf16 (its pair products), which these kernels
            // do not.
            let layer = pool_values(&gpu_layer.download(&dev).unwrap(), dtype);
            let q: Vec<f32> = (0..lens.len() * heads_q * dim)
                .map(|_| rng.random::<f32>() * 2.0 - 1.0)
                .collect();
            let dq = dev.stream.clone_htod(&q).unwrap();
            let scale = (1.0 + 3.0 * rng.random::<f32>()) / (dim as f32).sqrt();
            // The model's geometry also writes the o product's input in place.
            let layer_kernels = ((dim, page) == (128, 16))
                .then(|| LayerKernels::new(&dev, dim, page, dtype).unwrap());
            for &variant in variants {
                let mut attn = DecodeAttention::new(&dev, geom, dtype, heads_q, variant).unwrap();
                for table in [
                    dense_table(&seqs, page),
                    sparse_table(&mut rng, &seqs, page, kv_heads),
                ] {
                    let mut want = vec![0.0f32; q.len()];
                    decode_attention(&layer, &table, &q, heads_q, scale, &mut want).unwrap();
                    let dt = DeviceTable::upload(&dev, &table, kv_heads, page, pool).unwrap();
                    // Round 0 runs the planner's choice, rounds 1 and 2 many small items, twice,
                    // so the merge counters must have been reset by the first launch; round 2
                    // launches as a dependent of the previous kernel.
                    for round in 0..3 {
                        attn.config.waves = if round == 0 { 0 } else { 8 };
                        attn.dependent_launch = round == 2;
                        let mut out = dev.stream.clone_htod(&vec![f32::NAN; q.len()]).unwrap();
                        let plan = attn
                            .run(&dev, &gpu_layer, &dt, &dq, scale, &mut out)
                            .unwrap();
                        let got = dev.stream.clone_dtoh(&out).unwrap();
                        let what = format!(
                            "{dtype} {heads_q}q/{kv_heads}kv d{dim} p{page} {variant:?} rows/seq {} round {round} ({} items, {} partials)",
                            table.rows_per_seq,
                            plan.items.len(),
                            plan.partials
                        );
                        assert!(
                            got.iter().all(|x| x.is_finite()),
                            "{what}: unwritten or non-finite output"
                        );
                        let e = rel_err(&got, &want);
                        assert!(e < 1e-4, "{what}: relative error {e}");
                    }
                    if let Some(lk) = &layer_kernels {
                        same_as_converted(&dev, lk, &mut attn, &gpu_layer, &dt, &dq, scale);
                    }
                }
            }
        }
    }
}

/// The output written as the next product's input (bf16, or scaled f16; into a longer buffer,
/// whose tail stays untouched) is the f32 output converted by the layer kernels, bit for bit,
/// over the plan last loaded.
fn same_as_converted(
    dev: &Device,
    lk: &LayerKernels,
    attn: &mut DecodeAttention,
    layer: &GpuLayerKv,
    table: &DeviceTable,
    q: &vortex_cuda::CudaSlice<f32>,
    scale: f32,
) {
    let n = q.len();
    let mut out = dev.stream.alloc_zeros::<f32>(n).unwrap();
    attn.launch(dev, layer, table, q, scale, &mut out).unwrap();
    for input in [Input::Bf16, Input::F16Scaled] {
        let mut fused = dev.stream.alloc_zeros::<bf16>(n + 64).unwrap();
        attn.launch(
            dev,
            layer,
            table,
            q,
            scale,
            AttnOut::Input(&mut fused, input),
        )
        .unwrap();
        let mut converted = dev.stream.alloc_zeros::<bf16>(n).unwrap();
        lk.to_input(dev, &out, n, &mut converted, input).unwrap();
        let fused = dev.stream.clone_dtoh(&fused).unwrap();
        let converted = dev.stream.clone_dtoh(&converted).unwrap();
        let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fused[..n]), bits(&converted), "{input:?}");
        assert!(
            fused[n..].iter().all(|x| x.to_bits() == 0),
            "{input:?}: past the output"
        );
    }
}

/// The decode build for sliding-window layers against the CPU's windowed attention of each
/// sequence's newest token: rows list the pages the window touches and skip the first page's
/// tokens before it (the count in bits 16 and up of the row's last-page length), whole-row and
/// chunked builds, bf16 and fp8 pools, windows shorter than a page, across pages, and longer
/// than some sequences. Positions outside a window hold NaN: no build may read them.
#[test]
fn windowed_decode_matches_the_cpu() {
    let Some(dev) = common::device_or_skip("windowed_decode_matches_the_cpu") else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(common::test_seed());
    // (KV heads, head_dim, page size, query heads per KV head)
    // Pages of head_dim 256 go in steps of 8 tokens: a window may skip whole steps of its
    // first page, summed per head (4) or per token (3).
    for (kv_heads, dim, page, group) in [
        (1, 256, 16, 4),
        (1, 256, 16, 3),
        (1, 256, 64, 4),
        (2, 64, 4, 3),
        (4, 128, 16, 2),
    ] {
        let geom = KvGeometry::new(kv_heads, dim, page).unwrap();
        let heads_q = kv_heads * group;
        let lens = [1usize, 7, 16, 17, 100, 700, 1500];
        let num_pages: usize = lens.iter().map(|l| l.div_ceil(page)).sum();
        let mut ids: Vec<u32> = (0..num_pages as u32).collect();
        ids.shuffle(&mut rng);
        let seq_pages: Vec<Vec<u32>> = lens
            .iter()
            .map(|l| ids.drain(..l.div_ceil(page)).collect())
            .collect();
        let layer = random_layer(&mut rng, geom, num_pages);
        let width = heads_q * dim;
        let q: Vec<f32> = (0..lens.len() * width)
            .map(|_| (rng.random::<f32>() * 2.0 - 1.0) * 3.0)
            .collect();
        let scale = 1.0 / (dim as f32).sqrt();
        for window in [1usize, 5, 37, 512] {
            let mut table = PageTable::new(1);
            let mut packed = Vec::new();
            for (pages, &len) in seq_pages.iter().zip(&lens) {
                let first = len.saturating_sub(window);
                let last = len - (pages.len() - 1) * page;
                table.push_row(&pages[first / page..], last);
                packed.push(last as u32 | (((first % page) as u32) << 16));
            }
            let mut layer = layer.clone();
            for (pages, &len) in seq_pages.iter().zip(&lens) {
                let first = len.saturating_sub(window);
                poison_positions(&mut layer, pages, first / page * page..first);
                poison_positions(&mut layer, pages, len..pages.len() * page);
            }
            for dtype in [PoolDtype::Bf16, PoolDtype::Fp8] {
                let cpu_layer = pool_values(&layer, dtype);
                let mut want = vec![0.0f32; q.len()];
                for (b, (pages, &len)) in seq_pages.iter().zip(&lens).enumerate() {
                    let row = b * width..(b + 1) * width;
                    windowed_reference(
                        &cpu_layer,
                        pages,
                        len,
                        window,
                        &q[row.clone()],
                        scale,
                        &mut want[row],
                    );
                }
                let gpu_layer = GpuLayerKv::upload(&dev, &layer, dtype).unwrap();
                let mut dt = DeviceTable::upload(&dev, &table, kv_heads, page, num_pages).unwrap();
                dev.upload(&packed, &mut dt.last_page_len.slice_mut(..packed.len()))
                    .unwrap();
                let qd = dev.stream.clone_htod(&q).unwrap();
                for variant in [step_attention::ONE_ROUND, step_attention::CHUNKED] {
                    let Ok(mut attn) =
                        DecodeAttention::with_first_skips(&dev, geom, dtype, heads_q, variant)
                    else {
                        continue; // too many query heads for the whole-row build's warps
                    };
                    let mut out = dev.stream.alloc_zeros::<f32>(q.len()).unwrap();
                    attn.run(&dev, &gpu_layer, &dt, &qd, scale, &mut out)
                        .unwrap();
                    let got = dev.stream.clone_dtoh(&out).unwrap();
                    let worst = got
                        .chunks(dim)
                        .zip(want.chunks(dim))
                        .map(|(g, w)| {
                            let diff: f32 = g.iter().zip(w).map(|(a, b)| (a - b).powi(2)).sum();
                            let norm: f32 = w.iter().map(|b| b * b).sum();
                            (diff / norm.max(1e-12)).sqrt()
                        })
                        .fold(0.0f32, f32::max);
                    eprintln!(
                        "windowed decode: {kv_heads} KV heads x {group}, dim {dim}, page {page}, window {window}, {dtype}, {} warps: worst row error {worst:.2e}",
                        variant.warps
                    );
                    assert!(worst < 1e-3, "{worst}");
                }
            }
        }
    }
}

/// Softmax attention in f32 of one query row (`heads_q` heads) over the last `window` of a
/// sequence's `len` positions.
fn windowed_reference(
    layer: &LayerKv,
    pages: &[u32],
    len: usize,
    window: usize,
    q: &[f32],
    scale: f32,
    out: &mut [f32],
) {
    let g = layer.geometry();
    let (dim, page) = (g.head_dim, g.page_size);
    let group = q.len() / dim / g.kv_heads;
    let (mut k, mut v) = (vec![0.0f32; dim], vec![0.0f32; dim]);
    for (h, (qh, oh)) in q.chunks(dim).zip(out.chunks_mut(dim)).enumerate() {
        let mut scores = Vec::new();
        let mut values = Vec::new();
        for pos in len.saturating_sub(window)..len {
            let at = layer.head_offset(pages[pos / page], h / group) + (pos % page) * dim;
            layer.k.read_f32(at, &mut k);
            layer.v.read_f32(at, &mut v);
            scores.push(scale * qh.iter().zip(&k).map(|(a, b)| a * b).sum::<f32>());
            values.push(v.clone());
        }
        let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let w: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
        let sum: f32 = w.iter().sum();
        for (d, o) in oh.iter_mut().enumerate() {
            *o = w.iter().zip(&values).map(|(p, v)| p * v[d]).sum::<f32>() / sum;
        }
    }
}
