//! Every built-in flow without state (and one of six page fields of four types, one with each
//! reduction over a head's dims, one with products by the query's sign, one with sums on the
//! tensor cores, one whose cache phase is too large for a warp's shared memory), on the GPU
//! against the CPU flow runner: the generated cache phase gives the CPU's page fields, and the
//! generated index phase keeps the CPU's pages for every (sequence, KV head). Skips visibly
//! without a GPU.

mod common;
#[path = "common/pass_flows.rs"]
#[allow(dead_code)] // the others run in gpu_flow_passes
mod pass_flows;
#[path = "common/random_pool.rs"]
mod random_pool;

use half::{bf16, f16};
use rand::Rng;
use random_pool::{RandomPool, assert_rows_agree, pool_values, seeded_rng, upload_fields};
use vortex_cuda::codegen;
use vortex_cuda::generated::GeneratedFlow;
use vortex_cuda::index_row::sel_rows;
use vortex_cuda::page_list::PageList;
use vortex_cuda::{DeviceTable, GpuLayerKv, PoolDtype};
use vortex_flow::library::{BUILTIN, load};
use vortex_flow::runner::{FlowRunner, StepSeq};
use vortex_flow::{Geometry, compile};
use vortex_kv::{F8E4M3, KvDtype, KvElem, KvGeometry, LayerKv, PageFields, PageTable, Sequence};

/// (heads_q, kv_heads, head_dim, page, budget pages, sequence lengths)
type Case = (usize, usize, usize, usize, usize, &'static [usize]);

#[test]
fn generated_flows_match_the_cpu_runner() {
    let Some(dev) = common::device_or_skip("generated_flows_match_the_cpu_runner") else {
        return;
    };
    let mut rng = seeded_rng();
    let cases: &[Case] = &[
        (32, 8, 128, 16, 64, &[9000, 2100, 300, 40]),
        (8, 2, 64, 8, 24, &[3000, 777, 64]),
        // Eight query heads per KV head (double_sparse's index on the tensor cores in two tiles).
        (16, 2, 128, 16, 48, &[5000, 900]),
        // One long sequence: 8 rows, each scored by a cluster of up to 8 blocks.
        (32, 8, 128, 16, 128, &[30_000]),
        // Two query heads per KV head (the tensor cores' columns half empty).
        (16, 8, 128, 16, 32, &[2500, 700]),
        // head_dim 256: Quest's query sets in shared memory beside its two fp8 fields.
        (4, 1, 256, 16, 24, &[3000, 650]),
    ];
    let mut runs = Vec::new();
    let names = BUILTIN.iter().map(|(name, _)| *name).chain([
        "wide",
        "reductions",
        "products",
        "sums",
        "thread_cache",
    ]);
    for name in names {
        for &case in cases {
            let (heads_q, kv_heads, dim, page, _, _) = case;
            let g = Geometry {
                heads_q,
                heads_kv: kv_heads,
                head_dim: dim,
                page_size: page,
            };
            let flow = match name {
                "wide" => compile("wide.flow", pass_flows::WIDE, g).unwrap(),
                "reductions" => compile("reductions.flow", pass_flows::REDUCTIONS, g).unwrap(),
                "products" => compile("products.flow", pass_flows::PRODUCTS, g).unwrap(),
                "sums" => compile("sums.flow", pass_flows::SUMS, g).unwrap(),
                "thread_cache" => {
                    compile("thread_cache.flow", pass_flows::THREAD_CACHE, g).unwrap()
                }
                _ => load(name, g).unwrap(),
            };
            // Flows that keep state are compared over several steps in gpu_flow_passes; the
            // dense flow selects nothing to compare.
            let dense = flow.settings.budget_ratio.is_some_and(|r| r >= 1.0);
            if codegen::unsupported(&flow).is_none() && flow.states.is_empty() && !dense {
                runs.push((name, case, flow));
            }
        }
    }
    // Their kernels compiled at once on every core, not one by one below.
    let builds: Vec<_> = (runs.iter())
        .flat_map(|(_, _, f)| [(f, PoolDtype::Bf16), (f, PoolDtype::Fp8)])
        .collect();
    GeneratedFlow::warm(&dev, &builds).unwrap();
    let mut ran = Vec::new();
    let mut most_parts = 1;
    for (name, (heads_q, kv_heads, dim, page, budget, lens), flow) in runs {
        let runner = FlowRunner::new(flow);
        let mut settings = runner.flow.settings.clone();
        settings.budget = Some(budget);
        settings.budget_ratio = None;
        let kv = KvGeometry::new(kv_heads, dim, page).unwrap();
        let RandomPool {
            layer,
            pages: pool,
            seqs,
            complete,
        } = RandomPool::new(&mut rng, kv, lens);
        let mut fields = runner.new_fields(pool);
        runner.summarize(&layer, &mut fields, &complete);

        // Cache phase: the generated kernel's fields against the CPU's, over a bf16 pool and
        // over an fp8 one (against the CPU's fields of the fp8 pool's values).
        check_cache_phase(
            &dev,
            name,
            &runner,
            &layer,
            PoolDtype::Bf16,
            &fields,
            &complete,
        );
        let fp8 = pool_values(&layer, PoolDtype::Fp8);
        let mut fields8 = runner.new_fields(pool);
        runner.summarize(&fp8, &mut fields8, &complete);
        check_cache_phase(
            &dev,
            name,
            &runner,
            &fp8,
            PoolDtype::Fp8,
            &fields8,
            &complete,
        );
        let mut gen_flow = GeneratedFlow::new(&dev, &runner.flow, PoolDtype::Bf16).unwrap();

        // Index phase over the CPU's fields, so that both score the same values.
        let q: Vec<f32> = (0..lens.len() * heads_q * dim)
            .map(|_| rng.random::<f32>() * 2.0 - 1.0)
            .collect();
        let mut batch: Vec<StepSeq> = seqs
            .iter()
            .map(|seq| StepSeq {
                seq,
                settings: &settings,
                state: None,
            })
            .collect();
        let scores = runner.scores(0, &fields, &q, &mut batch);
        let mut want = PageTable::default();
        runner.table_from_scores(0, &batch, &scores, &mut want);
        let cpu_fields = upload_fields(&dev, &fields);
        let refs: Vec<&Sequence> = seqs.iter().collect();
        let dense = DeviceTable::upload(&dev, &PageTable::dense(&refs, page), kv_heads, page, pool)
            .unwrap();
        let dq = dev.stream.clone_htod(&q).unwrap();
        let per_seq: Vec<&vortex_flow::Settings> = seqs.iter().map(|_| &settings).collect();
        let rows = sel_rows(&dense.row_pages, &per_seq, 0, lens, kv_heads);
        let no_state = vec![None; seqs.len()];
        // Each row scored by the blocks the step plans (a cluster where rows are few and the
        // index phase is one pass), then by one block.
        let mut split = 1;
        for fixed in [None, Some(1)] {
            gen_flow.split.fixed = fixed;
            split = split.max(gen_flow.parts(&rows));
            let mut sparse = gen_flow
                .prepare(&dev, &dense, &rows, &no_state, None)
                .unwrap();
            gen_flow
                .launch(&dev, 0, &dense, &cpu_fields, pool, &dq, &rows, &mut sparse)
                .unwrap();
            let got = sparse.download(&dev).unwrap();
            assert_rows_agree(name, &seqs, kv_heads, &scores, &got, &want);
        }
        most_parts = most_parts.max(split);
        ran.push(format!("{name}/{dim}/{split}"));
    }
    eprintln!("compared (flow/head_dim/blocks a row): {}", ran.join(", "));
    if dev.clusters {
        assert!(most_parts > 1, "no flow split its rows over a cluster");
    }
    for name in [
        "wide",
        "sums",
        "block_topk",
        "quest",
        "double_sparse",
        "lsh",
        "global_local",
        "streaming",
    ] {
        assert!(
            ran.iter().any(|r| r.starts_with(name)),
            "{name} was not compared"
        );
    }
}

/// The generated cache phase over `layer` stored as `dtype` against the CPU's `fields` of the
/// same values. A sign of a sum that is zero to rounding may come out either way (LSH): a few
/// elements in ten thousand may differ, no more.
fn check_cache_phase(
    dev: &vortex_cuda::Device,
    name: &str,
    runner: &FlowRunner,
    layer: &LayerKv,
    dtype: PoolDtype,
    fields: &PageFields,
    complete: &[u32],
) {
    let kv_heads = layer.geometry().kv_heads;
    let gen_flow = GeneratedFlow::new(dev, &runner.flow, dtype).unwrap();
    let gpu_layer = GpuLayerKv::upload(dev, layer, dtype).unwrap();
    let pool = gpu_layer.num_pages;
    let mut gpu_fields = gen_flow.alloc_fields(dev, pool).unwrap();
    let listed = PageList::new(dev, complete).unwrap();
    gen_flow
        .summarize(dev, &gpu_layer, &mut gpu_fields, &listed)
        .unwrap();
    let (mut compared, mut off) = (0usize, Vec::new());
    for (f, spec) in runner.flow.fields.iter().enumerate() {
        let back = dev.stream.clone_dtoh(&gpu_fields[f]).unwrap();
        let e = spec.elems();
        for h in 0..kv_heads {
            for &p in complete {
                let mut want = vec![0.0f32; e];
                fields.read(f, p, h, &mut want);
                let at = (h * pool + p as usize) * e;
                for (i, &w) in want.iter().enumerate() {
                    let got = match spec.dtype {
                        KvDtype::F32 => f32::from_le_bytes(
                            back[(at + i) * 4..(at + i) * 4 + 4].try_into().unwrap(),
                        ),
                        KvDtype::Fp8 => F8E4M3(back[at + i]).to_f32(),
                        KvDtype::F16 => {
                            f16::from_le_bytes([back[(at + i) * 2], back[(at + i) * 2 + 1]])
                                .to_f32()
                        }
                        _ => bf16::from_le_bytes([back[(at + i) * 2], back[(at + i) * 2 + 1]])
                            .to_f32(),
                    };
                    compared += 1;
                    // Summation order may move a value across one rounding step.
                    let step = match spec.dtype {
                        KvDtype::Fp8 => w.abs() / 8.0 + 1.0 / 512.0,
                        _ => w.abs() / 128.0 + 1e-5,
                    };
                    if (got - w).abs() > step {
                        off.push(format!("{} h{h} p{p} [{i}]: {got} vs {w}", spec.name));
                    }
                }
            }
        }
    }
    assert!(
        off.len() * 10_000 <= compared,
        "{name} ({dtype}): {} of {compared} field values differ: {:?}",
        off.len(),
        &off[..off.len().min(8)]
    );
}
