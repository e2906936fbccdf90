//! `vortex bench decode --device cuda[:N]`: end-to-end decode steps of a whole model on the GPU
//! (random weights of a named geometry, or a loaded model's), batch x context, dense against
//! sparse flows, each against its bytes floor at the copy bandwidth measured in the same run.
//!
//! The context's keys and values are random, written straight into the pool and summarised by
//! the flow's cache phase, so a 32K context needs no 32K prefill; the timed steps then run the
//! real decode path (embedding to sampled token) and append to that context.

use std::process::ExitCode;
use std::time::Instant;

use serde::Serialize;
use vortex_cuda::compile::BuildStats;
use vortex_cuda::model::{GpuModel, GpuStep, PoolSpec, Profiler, WeightSource};
use vortex_cuda::timing::{copy_bandwidth, median};
use vortex_cuda::{Device, PoolDtype};
use vortex_flow::state::StateSlot;
use vortex_flow::{Flow, Geometry};
use vortex_kv::{KvGeometry, Sequence};
use vortex_model::config::ModelConfig;

use crate::bench_decode::DecodeArgs;
use crate::flow_args::FlowArgs;

#[derive(Serialize)]
struct Row {
    batch: usize,
    context: usize,
    flow: String,
    /// Median wall time of a whole step (forward pass and sampled tokens back on the host).
    step_ms: f64,
    /// Mean of the same steps (a step that completes a page also runs the cache phase).
    mean_step_ms: f64,
    tokens_per_s: f64,
    weight_bytes: usize,
    /// K and V bytes the step's attention reads, and the flow's summaries the index reads.
    kv_bytes: usize,
    summary_bytes: usize,
    floor_ms: f64,
    step_over_floor: f64,
    /// None where the flows measured leave out dense.
    speedup_vs_dense: Option<f64>,
    /// Device milliseconds per stage of one more step, timed with events between stages.
    stages_ms: Vec<(&'static str, f64)>,
}

#[derive(Serialize)]
struct Skipped {
    batch: usize,
    context: usize,
    reason: String,
}

pub fn run(args: &DecodeArgs, ordinal: usize) -> Result<ExitCode, String> {
    let kv_dtype = args.model.gpu_kv_dtype()?;
    let fp8_weights = args.model.fp8_weights(true)?;
    let dev = Device::open(ordinal).map_err(|e| e.to_string())?;
    let (config, name, loaded) = match &args.random_weights {
        Some(g) => (
            vortex_model::random::geometry(g)?,
            format!("random {g}"),
            None,
        ),
        None => {
            let l = args.model.load()?;
            (l.model.config.clone(), l.name.clone(), Some(l))
        }
    };
    let page = args.model.page_size;
    let geom =
        KvGeometry::new(config.heads_kv, config.head_dim, page).map_err(|e| e.to_string())?;
    let bandwidth = copy_bandwidth(&dev, 2 << 30, 10).map_err(|e| e.to_string())?;
    println!(
        "{} | {name}: {} layers, {}q/{}kv heads x {}, hidden {}, ffn {}, {kv_dtype} KV | copy bandwidth {bandwidth:.0} GB/s",
        dev.describe(),
        config.layers,
        config.heads_q,
        config.heads_kv,
        config.head_dim,
        config.hidden,
        config.ffn
    );
    let total_mem = dev.total_mem;
    let source = match &loaded {
        Some(l) => WeightSource::Model(&l.model),
        None => WeightSource::Random(args.seed),
    };
    let t = Instant::now();
    let built_before = BuildStats::now();
    let pool = PoolSpec {
        page_size: page,
        num_pages: 1,
        dtype: kv_dtype,
    };
    let mut gpu = GpuModel::new(
        dev,
        config.clone(),
        source,
        pool,
        &flow(args, "dense", &config)?,
    )
    .map_err(|e| e.to_string())?;
    if fp8_weights {
        gpu.use_fp8_weights().map_err(|e| e.to_string())?;
    }
    gpu.dev.synchronize().map_err(|e| e.to_string())?;
    gpu.use_graphs = !args.no_graphs;
    let weight_bytes = gpu.weights.step_bytes();
    let weight_dtype = if gpu.weights.fp8() { "fp8" } else { "bf16" };
    println!(
        "weights: {weight_dtype}, {:.2} GB read per step, ready in {:.1} s ({})",
        weight_bytes as f64 / 1e9,
        t.elapsed().as_secs_f64(),
        BuildStats::now().since(built_before).describe()
    );
    if args.stagger {
        println!(
            "staggered: sequence s starts s mod {page} tokens short of the context, so each step \
             some sequence completes a page"
        );
    }
    if args.settle_ms > 0 {
        println!(
            "settled: the device idles {} ms before each flow",
            args.settle_ms
        );
    }
    if args.ahead {
        println!("ahead: each step's tokens come from the last step's argmax on the device");
    }
    println!(
        "{:>5} {:>7} {:<11} {:>9} {:>10} {:>9} {:>8} {:>9}",
        "batch", "context", "flow", "step ms", "tokens/s", "floor ms", "/floor", "vs dense"
    );
    let (mut rows, mut skipped) = (Vec::new(), Vec::new());
    for &batch in &args.batch {
        for &context in &args.context {
            // The timed steps, the warm-ups, one profiled step and, decoding ahead, one queued
            // after the last timed.
            let steps = args.decode_tokens + args.warmup + 1 + args.ahead as usize;
            let pages = batch * geom.pages_for(context + steps) + 1;
            let need = GpuModel::kv_bytes_per_layer(geom, pages, kv_dtype)
                .saturating_mul(config.layers)
                .saturating_add(weight_bytes + (2 << 30));
            let reason = if context + steps > config.max_positions {
                Some(format!(
                    "{context} tokens and {steps} steps pass the model's context of {}",
                    config.max_positions
                ))
            } else if need > total_mem {
                Some(format!(
                    "needs {:.1} GB of the device's {:.1} GB",
                    need as f64 / 1e9,
                    total_mem as f64 / 1e9
                ))
            } else {
                None
            };
            if let Some(reason) = reason {
                println!("{batch:>5} {context:>7} skipped: {reason}");
                skipped.push(Skipped {
                    batch,
                    context,
                    reason,
                });
                continue;
            }
            gpu.reset(pages, &flow(args, "dense", &config)?)
                .map_err(|e| e.to_string())?;
            let mut seqs = vec![Sequence::default(); batch];
            gpu.fill_random_context(&mut seqs, context, args.seed)
                .map_err(|e| e.to_string())?;
            let start = |s: usize| {
                if args.stagger {
                    context.saturating_sub(s % page).max(1)
                } else {
                    context
                }
            };
            for (s, seq) in seqs.iter_mut().enumerate() {
                gpu.truncate(seq, start(s));
            }
            let mut dense_ms = 0.0;
            for name in &args.flows {
                let f = flow(args, name, &config)?;
                let refs: Vec<&Sequence> = seqs.iter().collect();
                gpu.set_flow(&f, &refs).map_err(|e| e.to_string())?;
                let slots = (0..batch)
                    .map(|_| gpu.state_slot())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| e.to_string())?;
                if args.settle_ms > 0 {
                    gpu.dev.synchronize().map_err(|e| e.to_string())?;
                    std::thread::sleep(std::time::Duration::from_millis(args.settle_ms));
                }
                let times = decode_steps(&mut gpu, &mut seqs, &slots, args)?;
                let stages_ms = profile_step(&mut gpu, &mut seqs, &slots)?;
                for (s, seq) in seqs.iter_mut().enumerate() {
                    gpu.truncate(seq, start(s));
                }
                let step_ms = median(&times);
                if name == "dense" {
                    dense_ms = step_ms;
                }
                let (kv_bytes, summary_bytes) =
                    step_bytes(&config, geom, kv_dtype, &f, batch, context);
                let floor_ms =
                    (weight_bytes + kv_bytes + summary_bytes) as f64 / (bandwidth * 1e9) * 1e3;
                let row = Row {
                    batch,
                    context,
                    flow: name.clone(),
                    step_ms,
                    mean_step_ms: times.iter().sum::<f64>() / times.len() as f64,
                    tokens_per_s: batch as f64 / (step_ms * 1e-3),
                    weight_bytes,
                    kv_bytes,
                    summary_bytes,
                    floor_ms,
                    step_over_floor: step_ms / floor_ms,
                    speedup_vs_dense: (dense_ms > 0.0).then(|| dense_ms / step_ms),
                    stages_ms,
                };
                println!(
                    "{:>5} {:>7} {:<11} {:>9.3} {:>10.0} {:>9.3} {:>7.2}x {:>9}",
                    batch,
                    context,
                    name,
                    row.step_ms,
                    row.tokens_per_s,
                    row.floor_ms,
                    row.step_over_floor,
                    crate::bench_decode::times(row.speedup_vs_dense)
                );
                let stages: Vec<String> = row
                    .stages_ms
                    .iter()
                    .map(|(n, ms)| format!("{n} {ms:.3}"))
                    .collect();
                println!("{:>26} device ms: {}", "", stages.join(", "));
                rows.push(row);
            }
        }
    }
    println!(
        "decode steps {} (CUDA graphs captured: {})",
        if gpu.use_graphs {
            "replayed as CUDA graphs where they repeat a captured one"
        } else {
            "launched kernel by kernel"
        },
        gpu.graphs_captured
    );
    if let Some(path) = &args.json_out {
        let v = serde_json::json!({
            "device": gpu.dev.describe(), "model": name, "copy_bandwidth_gbps": bandwidth,
            "cuda_graphs": gpu.use_graphs, "graphs_captured": gpu.graphs_captured,
            "page_size": page, "kv_dtype": kv_dtype.to_string(), "weight_dtype": weight_dtype, "budget_tokens": args.budget, "decode_steps": args.decode_tokens, "staggered": args.stagger, "ahead": args.ahead, "settle_ms": args.settle_ms,
            "rows": rows, "skipped": skipped,
        });
        std::fs::write(path, serde_json::to_string_pretty(&v).unwrap())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The flow `name` as the command line sets it: sparse flows keep `--budget` tokens.
fn flow(args: &DecodeArgs, name: &str, config: &ModelConfig) -> Result<Flow, String> {
    let mut fa = FlowArgs {
        flow: name.to_string(),
        ..FlowArgs::default()
    };
    if name != "dense" {
        fa.budget = Some(args.budget.div_ceil(args.model.page_size));
    }
    let g = Geometry {
        heads_q: config.heads_q,
        heads_kv: config.heads_kv,
        head_dim: config.head_dim,
        page_size: args.model.page_size,
    };
    fa.load(g, config.layers)
}

/// Warm-up and timed decode steps, each feeding back the tokens sampled on the device.
fn decode_steps(
    gpu: &mut GpuModel,
    seqs: &mut [Sequence],
    slots: &[Option<StateSlot>],
    args: &DecodeArgs,
) -> Result<Vec<f64>, String> {
    let mut next: Vec<u32> = (0..seqs.len() as u32).collect();
    let mut times = Vec::new();
    if !args.ahead {
        for i in 0..args.warmup + args.decode_tokens {
            let t = Instant::now();
            gpu.forward(&mut one_token_steps(seqs, slots, &next))
                .map_err(|e| e.to_string())?;
            next = gpu.argmax().map_err(|e| e.to_string())?;
            if i >= args.warmup {
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        return Ok(times);
    }
    // Step i is queued before step i - 1's tokens are read; a step's time is from one read to
    // the next. The last step queued is not timed (and leaves its tokens unread).
    let e = |e: vortex_cuda::CudaError| e.to_string();
    gpu.forward(&mut one_token_steps(seqs, slots, &next))
        .map_err(e)?;
    let mut t = Instant::now();
    for i in 0..args.warmup + args.decode_tokens {
        gpu.argmax_ahead().map_err(e)?;
        // The tokens given are not read: the pass takes the picked ones.
        gpu.forward(&mut one_token_steps(seqs, slots, &next))
            .map_err(e)?;
        next = gpu.picked().map_err(e)?;
        if i >= args.warmup {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        t = Instant::now();
    }
    gpu.dev.synchronize().map_err(e)?;
    Ok(times)
}

/// A decode step of each sequence with its token (and its state slot).
fn one_token_steps<'a>(
    seqs: &'a mut [Sequence],
    slots: &'a [Option<StateSlot>],
    tokens: &'a [u32],
) -> Vec<GpuStep<'a>> {
    seqs.iter_mut()
        .zip(tokens)
        .zip(slots)
        .map(|((seq, t), slot)| GpuStep {
            seq,
            tokens: std::slice::from_ref(t),
            state: slot.as_ref(),
            flow: 0,
        })
        .collect()
}

/// One more step with the profiler on: device milliseconds per stage.
fn profile_step(
    gpu: &mut GpuModel,
    seqs: &mut [Sequence],
    slots: &[Option<StateSlot>],
) -> Result<Vec<(&'static str, f64)>, String> {
    gpu.profiler = Some(Profiler::default());
    let next: Vec<u32> = (0..seqs.len() as u32).collect();
    let result = gpu
        .forward(&mut one_token_steps(seqs, slots, &next))
        .and_then(|_| {
            let dev = &gpu.dev;
            gpu.profiler.as_mut().expect("set above").take(dev)
        });
    gpu.profiler = None;
    Ok(result
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|(s, ms)| (s.name(), ms))
        .collect())
}

/// Bytes a step's attention reads per its flow: K and V of the pages it keeps, and the
/// summaries of the candidate pages its index phase scores.
fn step_bytes(
    cfg: &ModelConfig,
    geom: KvGeometry,
    kv_dtype: PoolDtype,
    flow: &Flow,
    batch: usize,
    context: usize,
) -> (usize, usize) {
    let settings = &flow.settings;
    let field_bytes: usize = flow.fields.iter().map(|f| f.elems() * f.dtype.size()).sum();
    let state_bytes: usize = flow.states.iter().map(|s| s.rows * s.cols * 4 * 2).sum();
    let pages = geom.pages_for(context + 1);
    let per_page = geom.page_elems() * 2 * kv_dtype.size();
    let mut kv = 0;
    let mut summaries = 0;
    for l in 0..cfg.layers {
        // A sliding-window layer reads the pages its window touches, whatever the flow (one
        // more than a window's worth, an upper bound: one page fewer when it starts on a page).
        if let Some(w) = cfg.window(l) {
            kv += geom
                .pages_for(w.min(context + 1))
                .saturating_add(1)
                .min(pages)
                * per_page;
            continue;
        }
        let dense = flow.index.is_none()
            && flow.cache.is_none()
            && settings.budget_ratio.is_some_and(|r| r >= 1.0)
            || settings.is_dense(l, context + 1, pages);
        if dense {
            kv += pages * per_page;
            continue;
        }
        let kept = settings.budget_pages(pages).min(pages);
        kv += kept * per_page;
        if flow.index.is_some() && flow.states.is_empty() {
            let candidates = pages.saturating_sub(settings.sinks + settings.recent.max(1));
            summaries += candidates * cfg.heads_kv * field_bytes;
        } else if flow.index.is_some() {
            // A flow with state scores every complete page and reads and writes its state.
            summaries +=
                (context + 1) / geom.page_size * cfg.heads_kv * (field_bytes + state_bytes);
        }
    }
    (batch * kv, batch * summaries)
}
