//! The GPU index phase of block top-k and Quest, with bf16 or fp8 summaries, against the CPU flow
//! runner: the same cache-phase summaries, and the same pages selected for every (sequence, KV
//! head), sinks and recent pages included. Skips visibly without a GPU.

mod common;
#[path = "common/random_pool.rs"]
mod random_pool;

use half::bf16;
use rand::Rng;
use random_pool::{RandomPool, SelectionCase, case_runner, pool_values, seeded_rng, upload_fields};
use vortex_cuda::block_topk::{BlockTopk, Summary};
use vortex_cuda::index_row::{MAX_PARTS, sel_rows};
use vortex_cuda::page_list::PageList;
use vortex_cuda::{DeviceTable, GpuLayerKv, KvKernels, PoolDtype};
use vortex_flow::runner::StepSeq;
use vortex_kv::{F8E4M3, KvDtype, KvElem, LayerKv, PageFields, PageTable, Sequence};

#[test]
fn block_topk_selects_the_cpu_pages() {
    selects_the_cpu_pages("block_topk");
}

#[test]
fn block_topk_fp8_selects_the_cpu_pages() {
    selects_the_cpu_pages("block_topk_fp8");
}

#[test]
fn quest_selects_the_cpu_pages() {
    selects_the_cpu_pages("quest");
}

#[test]
fn quest_fp8_selects_the_cpu_pages() {
    selects_the_cpu_pages("quest_fp8");
}

fn selects_the_cpu_pages(flow: &str) {
    let Some(dev) = common::device_or_skip(&format!("{flow}_selects_the_cpu_pages")) else {
        return;
    };
    let summary = Summary::for_flow(flow).unwrap();
    let mut rng = seeded_rng();
    let cases: &[SelectionCase] = &[
        (
            32,
            8,
            128,
            16,
            128,
            1,
            1,
            &[33_000, 5000, 2048, 100, 20_000],
        ),
        (8, 2, 64, 8, 40, 4, 8, &[9000, 333, 41, 20_000]),
        (16, 4, 128, 16, 300, 2, 3, &[70_000, 4096]),
        // Fewer than four query heads per KV head: unused columns of the tensor-core scores.
        (16, 8, 128, 16, 128, 1, 4, &[20_000, 3000, 700]),
        (9, 3, 64, 16, 64, 1, 2, &[9000, 500, 40]),
        // Seven and eight query heads per KV head: the parts and rests in two tiles.
        (14, 2, 64, 16, 64, 1, 2, &[9000, 1000]),
        (16, 2, 128, 16, 96, 1, 2, &[9000, 3000, 41]),
        // Sixteen: centroid scores on the CUDA cores.
        (32, 2, 64, 16, 64, 1, 2, &[5000, 700]),
        // Two long sequences of Qwen3-8B's shape: 16 rows, 4 blocks a row on an H100 or H200
        // (the others take 2 or 8).
        (32, 8, 128, 16, 128, 1, 1, &[30_000, 12_000]),
    ];
    let mut most_parts = 1;
    for (ci, case) in cases.iter().enumerate() {
        let (runner, settings, kv) = case_runner(flow, case);
        let &(heads_q, kv_heads, dim, page, _, _, _, lens) = case;
        let RandomPool {
            layer,
            pages: pool,
            seqs,
            complete,
        } = RandomPool::new(&mut rng, kv, lens);
        let mut fields = runner.new_fields(pool);
        runner.summarize(&layer, &mut fields, &complete);
        let q: Vec<f32> = (0..lens.len() * heads_q * dim)
            // The first case's queries pass f16's range and the second's lie below its normal
            // range; the fp8 scorer scales both into it.
            .map(|_| (rng.random::<f32>() * 2.0 - 1.0) * [1e5, 1e-6, 1.0][ci.min(2)])
            .collect();
        let mut batch: Vec<StepSeq> = seqs
            .iter()
            .map(|seq| StepSeq {
                seq,
                settings: &settings,
                state: None,
            })
            .collect();
        let mut want = PageTable::default();
        runner.select(0, &fields, &q, &mut batch, &mut want);

        let refs: Vec<&Sequence> = seqs.iter().collect();
        let dense = DeviceTable::upload(&dev, &PageTable::dense(&refs, page), kv_heads, page, pool)
            .unwrap();
        // The cache phase on the GPU gives the CPU's summaries (means to one rounding step of
        // their dtype, minima and maxima exactly), from a bf16 pool and from an fp8 one
        // (against the CPU's summaries of the fp8 pool's values).
        check_cache_phase(&dev, summary, &layer, PoolDtype::Bf16, &fields, &complete);
        let fp8 = pool_values(&layer, PoolDtype::Fp8);
        let mut fields8 = runner.new_fields(pool);
        runner.summarize(&fp8, &mut fields8, &complete);
        check_cache_phase(&dev, summary, &fp8, PoolDtype::Fp8, &fields8, &complete);
        // Select from the CPU's summaries, so that both sides score the same values.
        let summaries = upload_fields(&dev, &fields);
        let refs_f: Vec<_> = summaries.iter().collect();
        let dq = dev.stream.clone_htod(&q).unwrap();
        let mut topk = BlockTopk::new(&dev, kv, heads_q, summary).unwrap();
        let most = topk.split.most();
        assert!(
            most.is_power_of_two() && most <= MAX_PARTS,
            "{most} blocks a cluster"
        );
        assert_eq!(most > 1, dev.clusters, "clusters of {most} blocks");
        let per_seq: Vec<&vortex_flow::Settings> = seqs.iter().map(|_| &settings).collect();
        let rows = sel_rows(&dense.row_pages, &per_seq, 0, lens, kv_heads);
        // Each row scored by the blocks the step plans (a cluster of them where rows are few),
        // then by one block.
        for fixed in [None, Some(1)] {
            topk.split.fixed = fixed;
            let parts = topk.parts(&rows);
            most_parts = most_parts.max(parts);
            let mut sparse = topk.prepare(&dev, &dense, &rows, None).unwrap();
            topk.launch(&dev, &dense, &refs_f, pool, &dq, &rows, &mut sparse)
                .unwrap();
            eprintln!("case {ci}: {} rows, {parts} blocks a row", rows.len());
            let got = sparse.download(&dev).unwrap();
            assert_eq!(got.rows_per_seq, want.rows_per_seq);
            assert_eq!(got.indptr, want.indptr, "row lengths");
            assert_eq!(got.last_page_len, want.last_page_len);
            // Scores computed in a different order may swap pages whose scores tie to rounding at
            // the threshold; any other difference is a bug.
            let mut differing = 0;
            for r in 0..want.rows() {
                if got.pages(r) != want.pages(r) {
                    differing += 1;
                    let (s, h) = (r / kv_heads, r % kv_heads);
                    let score = |p: u32| -> f64 {
                        let mut c = vec![0.0f32; dim];
                        let mut c2 = vec![0.0f32; dim];
                        fields.read(0, p, h, &mut c);
                        if summary.fields() == 2 {
                            fields.read(1, p, h, &mut c2);
                        }
                        (0..heads_q / kv_heads)
                            .map(|gq| {
                                let qh = &q[(s * heads_q + h * (heads_q / kv_heads) + gq) * dim..]
                                    [..dim];
                                (0..dim)
                                    .map(|d| {
                                        let a = qh[d] as f64 * c[d] as f64;
                                        match summary.fields() {
                                            2 => a.max(qh[d] as f64 * c2[d] as f64),
                                            _ => a,
                                        }
                                    })
                                    .sum::<f64>()
                            })
                            .fold(f64::NEG_INFINITY, f64::max)
                    };
                    let only = |a: &[u32], b: &[u32]| -> Vec<f64> {
                        a.iter()
                            .filter(|p| !b.contains(p))
                            .map(|&p| score(p))
                            .collect()
                    };
                    let (g_only, w_only) = (
                        only(got.pages(r), want.pages(r)),
                        only(want.pages(r), got.pages(r)),
                    );
                    let lo = g_only.iter().copied().fold(f64::INFINITY, f64::min);
                    let hi = w_only.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    assert!(
                        hi - lo < 1e-4 * (1.0 + hi.abs()),
                        "row {r} ({parts} blocks a row): pages differ beyond rounding ({lo} vs {hi})"
                    );
                    eprintln!("case {ci} row {r}: a tie at the threshold ({lo} vs {hi})");
                }
            }
            // Such ties are rare: at most one row in 20, or one row of a small case.
            assert!(
                differing <= (want.rows() / 20).max(1),
                "{differing} of {} rows differ ({parts} blocks a row)",
                want.rows()
            );
        }
    }
    if dev.clusters {
        assert!(most_parts > 1, "no case split its rows over a cluster");
    }
}

/// The GPU cache phase over `layer` stored as `dtype` against the CPU's summaries `cpu`.
fn check_cache_phase(
    dev: &vortex_cuda::Device,
    summary: Summary,
    layer: &LayerKv,
    dtype: PoolDtype,
    cpu: &PageFields,
    complete: &[u32],
) {
    let kv = layer.geometry();
    let (kv_heads, dim) = (kv.kv_heads, kv.head_dim);
    let kv_kernels = KvKernels::new(dev, kv, dtype).unwrap();
    let gpu_layer = GpuLayerKv::upload(dev, layer, dtype).unwrap();
    let pool = gpu_layer.num_pages;
    let mut gpu: Vec<_> = cpu
        .data
        .iter()
        .map(|c| {
            dev.stream
                .alloc_zeros::<u8>(c.len() * c.dtype().size())
                .unwrap()
        })
        .collect();
    let listed = &PageList::new(dev, complete).unwrap();
    match summary {
        Summary::Centroid => kv_kernels
            .page_means(dev, &gpu_layer, listed, &mut gpu[0])
            .unwrap(),
        Summary::CentroidFp8 => kv_kernels
            .page_means_fp8(dev, &gpu_layer, listed, &mut gpu[0])
            .unwrap(),
        Summary::MinMax => {
            let (a, b) = gpu.split_at_mut(1);
            kv_kernels
                .page_minmax(dev, &gpu_layer, listed, &mut a[0], &mut b[0])
                .unwrap()
        }
        Summary::MinMaxFp8 => {
            let (a, b) = gpu.split_at_mut(1);
            kv_kernels
                .page_minmax_fp8(dev, &gpu_layer, listed, &mut a[0], &mut b[0])
                .unwrap()
        }
    }
    for (f, gpu_f) in gpu.iter().enumerate() {
        let bytes = dev.stream.clone_dtoh(gpu_f).unwrap();
        let a: Vec<f32> = match summary.dtype() {
            KvDtype::Fp8 => bytes.iter().map(|&b| F8E4M3(b).to_f32()).collect(),
            _ => bytes
                .chunks(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        };
        let mut b = vec![0.0; cpu.data[f].len()];
        cpu.data[f].read_f32(0, &mut b);
        for h in 0..kv_heads {
            for &p in complete {
                for d in 0..dim {
                    let i = (h * pool + p as usize) * dim + d;
                    let (a, b) = (a[i], b[i]);
                    // Summation order may move a mean across one rounding step.
                    let tol = match summary {
                        Summary::Centroid => b.abs() / 128.0 + 1e-6,
                        Summary::CentroidFp8 => b.abs() / 8.0 + 1.0 / 512.0,
                        Summary::MinMax | Summary::MinMaxFp8 => 0.0,
                    };
                    assert!(
                        (a - b).abs() <= tol,
                        "{dtype} field {f} {h}/{p}/{d}: {a} vs {b}"
                    );
                }
            }
        }
    }
}
