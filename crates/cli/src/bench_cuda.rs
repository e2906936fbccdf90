//! `vortex bench attention --device cuda[:N]`: dense paged decode attention on the GPU against
//! the device's copy bandwidth, measured in the same run, for every kernel variant and planner
//! setting; the best per configuration is what a step would use. With the `block_topk`,
//! `quest` or `h2o` flow (or `all`), also that sparse step at each `--budget` (see
//! `bench_cuda_sparse`). The pool stores the one GPU type in `--kv-dtype` (bf16 or fp8).

use std::process::ExitCode;
use std::time::Instant;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::Serialize;
use vortex_cuda::attention::Variant;
use vortex_cuda::step_attention::{self, StepAttention};
use vortex_cuda::timing::{copy_bandwidth, median, time_grouped};
use vortex_cuda::{
    CudaError, DecodeAttention, Device, DeviceTable, GpuLayerKv, KvKernels, PoolDtype,
};
use vortex_kv::{KvGeometry, PageTable};

use crate::bench_attention::AttentionArgs;
use crate::bench_cuda_sparse as sparse;

/// Kernel shapes tried at every configuration: the two a model step chooses between, and
/// the others measured beside them.
const VARIANTS: [Variant; 5] = [
    step_attention::CHUNKED,
    Variant {
        warps: 8,
        min_blocks: 1,
        prefetch: false,
    },
    Variant {
        warps: 4,
        min_blocks: 3,
        prefetch: true,
    },
    Variant {
        warps: 4,
        min_blocks: 2,
        prefetch: true,
    },
    step_attention::ONE_ROUND,
];
/// Planner settings: 0 is the planner's own choice, others force work items per resident block.
const WAVES: [usize; 4] = [0, 1, 2, 4];

#[derive(Serialize)]
struct Row {
    batch: usize,
    context: usize,
    ragged: bool,
    warps: usize,
    min_blocks: usize,
    prefetch: bool,
    /// The pages' products on the tensor cores.
    tensor_cores: bool,
    regs: i32,
    /// Local memory a thread of the build takes (spilled registers), bytes.
    local_bytes: i32,
    blocks_per_sm: usize,
    waves: usize,
    items: usize,
    chunk_pages: usize,
    plan_us: f64,
    median_us: f64,
    min_us: f64,
    kv_bytes: usize,
    gbps: f64,
    copy_share: f64,
    /// The fastest row of its configuration.
    best: bool,
    /// What a model's decode step uses: the build it chooses and the planner's own choice.
    default: bool,
}

/// The pool's element type: the one GPU type among `--kv-dtype`.
fn pool_dtype(args: &AttentionArgs) -> Result<PoolDtype, String> {
    let gpu: Vec<PoolDtype> = args
        .kv_dtype
        .iter()
        .filter_map(|s| PoolDtype::parse(s).ok())
        .collect();
    match gpu[..] {
        [d] => Ok(d),
        _ => Err(format!(
            "--kv-dtype {}: a GPU run takes exactly one of bf16 and fp8",
            args.kv_dtype.join(",")
        )),
    }
}

pub fn run(args: &AttentionArgs, ordinal: usize) -> Result<ExitCode, String> {
    let g = args.geometry.geometry()?;
    let dtype = pool_dtype(args)?;
    let dev = Device::open(ordinal).map_err(|e| e.to_string())?;
    let geom = KvGeometry::new(g.heads_kv, g.head_dim, g.page_size).map_err(|e| e.to_string())?;
    let kv_kernels = KvKernels::new(&dev, geom, dtype).map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let mut kernels = Vec::new();
    for v in VARIANTS {
        // A launch shape the geometry does not fit (e.g. 8 warps of a wide group) is left out,
        // as the model's step leaves it out.
        match DecodeAttention::new(&dev, geom, dtype, g.heads_q, v) {
            Ok(k) => kernels.push(k),
            Err(CudaError::Unsupported(why)) if !args.json => {
                println!("attention variant {v:?} left out: {why}")
            }
            Err(CudaError::Unsupported(_)) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    if kernels.is_empty() {
        return Err("no decode attention kernel supports this geometry".into());
    }
    let step_attn = StepAttention::new(&dev, geom, dtype, g.heads_q).map_err(|e| e.to_string())?;
    let build_s = t0.elapsed().as_secs_f64();
    let cached = kernels.iter().all(|k| k.from_cache);
    let copy = copy_bandwidth(&dev, 2 << 30, 20).map_err(|e| e.to_string())?;
    if !args.json {
        println!(
            "{}; kernels {} in {build_s:.2} s; copy bandwidth {copy:.0} GB/s (read + write)",
            dev.describe(),
            if cached {
                "loaded from cache"
            } else {
                "compiled"
            }
        );
        println!(
            "geometry {}q/{}kv heads, head_dim {}, page {}, {dtype} KV ({}), dense paged table, {} pages{}",
            g.heads_q,
            g.heads_kv,
            g.head_dim,
            g.page_size,
            if kernels.iter().all(|k| k.tensor_cores) {
                "page products on the tensor cores"
            } else {
                "page products on the CUDA cores"
            },
            if args.sequential_pages {
                "sequential"
            } else {
                "shuffled"
            },
            if args.ragged {
                "; ragged: sequence s of a batch of b holds (s + 1) / b of the context"
            } else {
                ""
            }
        );
        println!(
            "times per launch (per step), {} back to back between two events",
            args.launches_per_timing.max(1)
        );
    }
    let iters = args.iters.max(1);
    let per_mark = args.launches_per_timing.max(1);
    let mut rows: Vec<Row> = Vec::new();
    let mut sparse_rows = Vec::new();
    // "all": the flows with hand-written index phases; any other flow or flow file named runs
    // its generated kernels.
    let sparse_flows: Vec<&str> = if args.flows.iter().any(|f| f == "all") {
        vec!["block_topk", "block_topk_fp8", "quest", "quest_fp8", "h2o"]
    } else {
        args.flows
            .iter()
            .map(String::as_str)
            .filter(|&f| f != "dense")
            .collect()
    };
    let mut rng = StdRng::seed_from_u64(11);
    for &batch in &args.batch {
        for &context in &args.context {
            let per_seq = geom.pages_for(context);
            let pool = batch
                .checked_mul(per_seq)
                .filter(|&p| i32::try_from(p).is_ok())
                .ok_or_else(|| {
                    format!(
                        "--batch {batch} --context {context}: more pages than a pool holds ({})",
                        i32::MAX
                    )
                })?;
            let mut layer = GpuLayerKv::new(&dev, geom, pool, dtype).map_err(|e| e.to_string())?;
            kv_kernels
                .fill_uniform(&dev, &mut layer, rng.random())
                .map_err(|e| e.to_string())?;
            let mut order: Vec<u32> = (0..pool as u32).collect();
            if !args.sequential_pages {
                order.shuffle(&mut rng);
            }
            // Uniform: every sequence at `context`; ragged: sequence s at (s + 1) / batch of it.
            let lens: Vec<usize> = (0..batch)
                .map(|s| {
                    if args.ragged {
                        (context * (s + 1) / batch).max(1)
                    } else {
                        context
                    }
                })
                .collect();
            let mut table = PageTable::new(1);
            for (s, &len) in lens.iter().enumerate() {
                let pages = geom.pages_for(len);
                let last = len - (pages - 1) * g.page_size;
                table.push_row(&order[s * per_seq..s * per_seq + pages], last);
            }
            let dt = DeviceTable::upload(&dev, &table, g.heads_kv, g.page_size, pool)
                .map_err(|e| e.to_string())?;
            let n = batch * g.heads_q * g.head_dim;
            let q: Vec<f32> = (0..n).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect();
            let dq = dev.stream.clone_htod(&q).map_err(|e| format!("{e:?}"))?;
            let mut out = dev
                .stream
                .alloc_zeros::<f32>(n)
                .map_err(|e| format!("{e:?}"))?;
            let scale = 1.0 / (g.head_dim as f32).sqrt();
            let kv_bytes = lens.iter().sum::<usize>() * g.heads_kv * g.head_dim * 2 * dtype.size();
            let first = rows.len();
            let (chosen, _) = step_attn.choose(&dt);
            for attn in kernels.iter_mut() {
                for waves in WAVES {
                    attn.config.waves = waves;
                    let t = Instant::now();
                    let plan = attn.plan(&dt);
                    let plan_us = t.elapsed().as_secs_f64() * 1e6;
                    attn.load_plan(&dev, &plan).map_err(|e| e.to_string())?;
                    let ms = time_grouped(&dev, 3, iters, per_mark, || {
                        attn.launch(&dev, &layer, &dt, &dq, scale, &mut out)
                    })
                    .map_err(|e| e.to_string())?;
                    let got = dev.stream.clone_dtoh(&out).map_err(|e| format!("{e:?}"))?;
                    if !got.iter().all(|x| x.is_finite()) {
                        return Err("GPU attention produced non-finite output".into());
                    }
                    let med = median(&ms);
                    let min = ms.iter().copied().fold(f64::INFINITY, f64::min);
                    let gbps = kv_bytes as f64 / (med * 1e-3) / 1e9;
                    rows.push(Row {
                        batch,
                        context,
                        ragged: args.ragged,
                        warps: attn.variant.warps,
                        min_blocks: attn.variant.min_blocks,
                        prefetch: attn.variant.prefetch,
                        tensor_cores: attn.tensor_cores,
                        regs: attn.registers,
                        local_bytes: attn.local_bytes,
                        blocks_per_sm: attn.config.blocks_per_sm,
                        waves,
                        items: plan.items.len(),
                        chunk_pages: plan.chunk_pages,
                        plan_us,
                        median_us: med * 1e3,
                        min_us: min * 1e3,
                        kv_bytes,
                        gbps,
                        copy_share: gbps / copy,
                        best: false,
                        default: waves == 0 && attn.variant == chosen,
                    });
                }
            }
            let best = (first..rows.len())
                .min_by(|&a, &b| rows[a].median_us.total_cmp(&rows[b].median_us))
                .unwrap_or(first);
            rows[best].best = true;
            if !args.json {
                print_rows(&rows[first..], first == 0);
            }
            if !sparse_flows.is_empty() {
                let dense_us = rows[first..]
                    .iter()
                    .find(|r| r.default)
                    .map_or(f64::NAN, |r| r.median_us);
                let mut setup = sparse::Setup {
                    dev: &dev,
                    kv_kernels: &kv_kernels,
                    layer: &layer,
                    dense: &dt,
                    q: &dq,
                    out: &mut out,
                    lens: &lens,
                    geometry: g,
                    copy_gbps: copy,
                    dense_us,
                    iters,
                    per_mark,
                    step_attn: &step_attn,
                    index_parts: args.index_parts,
                };
                for &budget in &args.budget {
                    for &flow in &sparse_flows {
                        if args.settle_ms > 0 {
                            dev.synchronize().map_err(|e| e.to_string())?;
                            std::thread::sleep(std::time::Duration::from_millis(args.settle_ms));
                        }
                        for attn in kernels.iter_mut() {
                            let r = sparse::sparse_step(&mut setup, attn, flow, budget)?;
                            sparse_rows.push(r);
                        }
                    }
                }
            }
        }
    }
    if !args.json {
        for (i, r) in sparse_rows.iter().enumerate() {
            sparse::print(r, i == 0);
        }
    }
    let report = serde_json::json!({
        "device": dev.describe(),
        "copy_gbps": copy,
        "heads_q": g.heads_q,
        "heads_kv": g.heads_kv,
        "head_dim": g.head_dim,
        "page_size": g.page_size,
        "kv_dtype": dtype.to_string(),
        "sequential_pages": args.sequential_pages,
        "iters": iters,
        "launches_per_timing": per_mark,
        "index_parts": args.index_parts,
        "rows": rows,
        "block_topk": sparse_rows,
    });
    let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    if let Some(path) = &args.json_out {
        std::fs::write(path, &text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if args.json {
        println!("{text}");
    }
    Ok(ExitCode::SUCCESS)
}

fn print_rows(rows: &[Row], header: bool) {
    if header {
        println!(
            "{:>5} {:>7} {:>5} {:>4} {:>4} {:>4} {:>5} {:>5} {:>6} {:>6} {:>7} {:>10} {:>10} {:>8} {:>6}",
            "batch",
            "context",
            "warps",
            "minb",
            "pref",
            "regs",
            "local",
            "waves",
            "items",
            "chunk",
            "plan us",
            "median us",
            "min us",
            "GB/s",
            "%copy"
        );
    }
    for r in rows {
        println!(
            "{:>5} {:>7} {:>5} {:>4} {:>4} {:>4} {:>5} {:>5} {:>6} {:>6} {:>7.1} {:>10.1} {:>10.1} {:>8.0} {:>5.1}%{}",
            r.batch,
            r.context,
            r.warps,
            r.min_blocks,
            if r.prefetch { "yes" } else { "no" },
            r.regs,
            r.local_bytes,
            if r.waves == 0 {
                "auto".to_string()
            } else {
                r.waves.to_string()
            },
            r.items,
            r.chunk_pages,
            r.plan_us,
            r.median_us,
            r.min_us,
            r.gbps,
            100.0 * r.copy_share,
            match (r.best, r.default) {
                (true, true) => "  <- best, default",
                (true, false) => "  <- best",
                (false, true) => "  <- default",
                _ => "",
            }
        );
    }
}
