//! `vortex bench decode`: prefill and decode tokens/s of a real model at several context lengths,
//! dense against sparse flows, compared with the memory floor measured in the same run.

use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::Serialize;
use vortex_flow::Flow;
use vortex_flow::runner::FlowRunner;
use vortex_kernels::bandwidth::measure_read_bandwidth;
use vortex_kv::{KvCache, KvGeometry, Sequence};
use vortex_model::config::ModelConfig;
use vortex_model::model::{KvState, SeqStep};
use vortex_model::sampling::argmax;

use crate::device_arg::DeviceArg;
use crate::flow_args::FlowArgs;
use crate::model_args::ModelArgs;

#[derive(Args)]
pub struct DecodeArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// Where to run: cpu, cuda or cuda:N for the whole model on a GPU.
    #[arg(long, default_value = "cpu")]
    pub(crate) device: DeviceArg,
    /// Random weights of a named geometry (qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b,
    /// gemma3-270m, gemma3-1b, gemma3-4b) or of a config.json, instead of --model; nothing is
    /// downloaded.
    #[arg(long, conflicts_with = "model")]
    pub(crate) random_weights: Option<String>,
    /// Sequences decoded together (cuda; the CPU bench decodes one).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub(crate) batch: Vec<usize>,
    /// Untimed decode steps before the timed ones (cuda).
    #[arg(long, default_value_t = 3)]
    pub(crate) warmup: usize,
    /// Seed of random weights and of the random context (cuda).
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Launch every kernel of a decode step one by one instead of replaying a CUDA graph (cuda).
    #[arg(long)]
    pub(crate) no_graphs: bool,
    /// Sequence s of a batch starts s mod page_size tokens short of the context, so that each
    /// step some sequence completes a page, as in serving, instead of all at once (cuda).
    #[arg(long)]
    pub(crate) stagger: bool,
    /// Decode ahead of the host (cuda): each step takes its tokens from the last step's argmax
    /// on the device, and the host reads them back while that step runs, so its work for a
    /// step overlaps the step before; otherwise the host reads each step's tokens first.
    #[arg(long)]
    pub(crate) ahead: bool,
    /// Idle this long before each flow's steps (cuda), so that every flow starts from the same
    /// board state: after dense, which draws the board's power limit, the next flow otherwise
    /// runs while the power controller still holds the clocks down.
    #[arg(long, default_value_t = 0)]
    pub(crate) settle_ms: u64,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub(crate) json_out: Option<std::path::PathBuf>,
    /// Context lengths in tokens (suffix k = 1024).
    #[arg(long, value_delimiter = ',', default_value = "512,4k,8k", value_parser = crate::bench_attention::parse_tokens)]
    pub(crate) context: Vec<usize>,
    /// Flows to compare (dense first).
    #[arg(long, value_delimiter = ',', default_value = "dense,block_topk,quest")]
    pub(crate) flows: Vec<String>,
    /// Page budget of the sparse flows, in tokens (suffix k = 1024).
    #[arg(long, default_value = "1k", value_parser = crate::bench_attention::parse_tokens)]
    pub(crate) budget: usize,
    /// Tokens decoded per measurement.
    #[arg(long, default_value_t = 32)]
    pub(crate) decode_tokens: usize,
    /// Print JSON instead of a table (cpu).
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Row {
    context: usize,
    flow: String,
    prefill_tokens_per_s: f64,
    decode_tokens_per_s: f64,
    decode_ms_per_token: f64,
    floor_tokens_per_s: f64,
    share_of_floor: f64,
    /// None where the flows measured leave out dense.
    speedup_vs_dense: Option<f64>,
}

pub fn run(mut args: DecodeArgs) -> Result<ExitCode, String> {
    // Dense first, so that every sparse row has its speedup against it.
    args.flows.sort_by_key(|f| f != "dense");
    if args.decode_tokens == 0 || args.batch.is_empty() || args.batch.contains(&0) {
        return Err("--decode-tokens and --batch must be at least 1".into());
    }
    // Far above any context or batch a device holds; sizes computed from them cannot wrap.
    for (flag, v) in [
        ("--decode-tokens", args.decode_tokens),
        ("--warmup", args.warmup),
        ("--batch", args.batch.iter().copied().max().unwrap_or(1)),
    ] {
        if v > 1 << 24 {
            return Err(format!("{flag} {v}: at most {}", 1 << 24));
        }
    }
    if let DeviceArg::Cuda(ordinal) = args.device {
        return crate::bench_cuda_decode::run(&args, ordinal);
    }
    if args.batch != [1] {
        return Err("--batch applies to --device cuda; the CPU bench decodes one sequence".into());
    }
    if args.json_out.is_some() {
        return Err(
            "--json-out applies to --device cuda; on the CPU, --json prints the JSON".into(),
        );
    }
    if args.no_graphs || args.stagger || args.ahead || args.settle_ms > 0 {
        return Err(
            "--no-graphs, --stagger, --ahead and --settle-ms apply to --device cuda".into(),
        );
    }
    let kv_dtype = args.model.kv_dtype()?;
    args.model.fp8_weights(false)?;
    let mut loaded = match &args.random_weights {
        Some(g) => args.model.load_random(g, args.seed, false)?,
        None => args.model.load()?,
    };
    loaded.model = args.model.for_cpu(loaded.model);
    let model = &loaded.model;
    let cfg = &model.config;
    let flows = load_flows(&args, cfg)?;
    let bandwidth = measure_read_bandwidth(1 << 30, 5);
    let threads = rayon::current_num_threads();
    let isa = vortex_kernels::quant::Isa::detect();
    let products = format!(
        "{}{}",
        isa.level().name(),
        if isa.bf16_pairs() {
            ", bf16 weights on bf16 pairs"
        } else {
            ""
        }
    );
    let weight_bytes = model.weight_bytes();
    let floor = bandwidth * 1e9 / weight_bytes as f64;
    let mut rng = StdRng::seed_from_u64(1);
    let mut rows: Vec<Row> = Vec::new();
    if !args.json {
        println!(
            "{}: {:.1} MB of weights per token; read bandwidth {bandwidth:.1} GB/s ({threads} threads) -> weight floor {floor:.0} tokens/s; products: {products}",
            loaded.name,
            weight_bytes as f64 / 1e6
        );
        println!(
            "{:>7} {:<12} {:>12} {:>12} {:>10} {:>8} {:>9}",
            "context", "flow", "prefill t/s", "decode t/s", "ms/token", "%floor", "vs dense"
        );
    }
    if args.decode_tokens == 0 || args.decode_tokens >= cfg.max_positions {
        return Err(format!(
            "--decode-tokens must be in 1..{}",
            cfg.max_positions
        ));
    }
    for &asked in &args.context {
        let context = fitted_context(asked, args.decode_tokens, cfg.max_positions);
        let geom = KvGeometry::new(cfg.heads_kv, cfg.head_dim, args.model.page_size)
            .map_err(|e| e.to_string())?;
        let pages = geom.pages_for(context + args.decode_tokens) * 2 + 2;
        let cache = KvCache::new(geom, kv_dtype, cfg.layers, pages);
        let dense = FlowArgs {
            flow: "dense".into(),
            ..FlowArgs::default()
        }
        .load(args.model.geometry(cfg), cfg.layers)?;
        let mut kv = KvState::new(cache, FlowRunner::new(dense));
        let prompt: Vec<u32> = (0..context)
            .map(|_| rng.random_range(0..cfg.vocab as u32))
            .collect();
        let mut seq = Sequence::default();
        let mut state = kv.flow.new_state(cfg.layers);
        let settings = kv.flow.flow.settings.clone();
        let start = Instant::now();
        let mut logits = Vec::new();
        for chunk in vortex_model::generate::prefill_chunks(&prompt, args.model.prefill_chunk) {
            let mut step = [SeqStep {
                seq: &mut seq,
                state: &mut state,
                settings: &settings,
                tokens: chunk,
            }];
            logits = model
                .forward(&mut kv, &mut step)
                .map_err(|e| e.to_string())?
                .pop()
                .unwrap();
        }
        let prefill_secs = start.elapsed().as_secs_f64();
        let first = argmax(&logits);
        let mut dense_tps = 0.0;
        for (name, flow) in args.flows.iter().zip(&flows) {
            let flow = flow.clone();
            let settings = flow.settings.clone();
            let t = Instant::now();
            kv.switch_flow(FlowRunner::new(flow), &[&seq]);
            let summarize_secs = t.elapsed().as_secs_f64();
            let mut fork = kv.cache.fork(&seq);
            let mut fstate = kv.flow.new_state(cfg.layers);
            let mut token = first;
            let t = Instant::now();
            for _ in 0..args.decode_tokens {
                let mut step = [SeqStep {
                    seq: &mut fork,
                    state: &mut fstate,
                    settings: &settings,
                    tokens: std::slice::from_ref(&token),
                }];
                let l = model
                    .forward(&mut kv, &mut step)
                    .map_err(|e| e.to_string())?;
                token = argmax(&l[0]);
            }
            let decode_secs = t.elapsed().as_secs_f64();
            kv.cache.free(&mut fork);
            let decode_tps = args.decode_tokens as f64 / decode_secs;
            if name == "dense" {
                dense_tps = decode_tps;
            }
            let row = Row {
                context,
                flow: name.clone(),
                prefill_tokens_per_s: context as f64 / (prefill_secs + summarize_secs),
                decode_tokens_per_s: decode_tps,
                decode_ms_per_token: 1e3 / decode_tps,
                floor_tokens_per_s: floor,
                share_of_floor: decode_tps / floor,
                speedup_vs_dense: (dense_tps > 0.0).then(|| decode_tps / dense_tps),
            };
            if !args.json {
                println!(
                    "{:>7} {:<12} {:>12.1} {:>12.1} {:>10.2} {:>7.1}% {:>9}",
                    row.context,
                    row.flow,
                    row.prefill_tokens_per_s,
                    row.decode_tokens_per_s,
                    row.decode_ms_per_token,
                    100.0 * row.share_of_floor,
                    times(row.speedup_vs_dense)
                );
            }
            rows.push(row);
        }
        kv.cache.free(&mut seq);
    }
    let rss = resident_memory();
    if args.json {
        let v = serde_json::json!({
            "model": loaded.name, "bandwidth_gbps": bandwidth, "threads": threads,
            "products": isa.level().name(), "bf16_pairs": isa.bf16_pairs(),
            "weight_bytes_per_token": weight_bytes, "file_bytes": loaded.file_bytes,
            "resident": rss, "rows": rows,
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap());
    } else if let Some((_, anon)) = rss.filter(|_| args.random_weights.is_some()) {
        // No weight file: the weights are drawn into anonymous memory.
        println!(
            "resident: {:.1} MB anonymous (the random weights, KV cache, buffers)",
            anon as f64 / 1e6
        );
    } else if let Some((file, anon)) = rss {
        println!(
            "resident: {:.1} MB of mapped weight files ({:.2}x the {:.1} MB on disk), {:.1} MB anonymous (KV cache, buffers)",
            file as f64 / 1e6,
            file as f64 / loaded.file_bytes.max(1) as f64,
            loaded.file_bytes as f64 / 1e6,
            anon as f64 / 1e6
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Every flow of `--flows` with `--budget`, loaded before anything is measured so that a bad
/// one fails at once; the budget's pages are named in tokens too, as the flag gives them.
fn load_flows(args: &DecodeArgs, cfg: &ModelConfig) -> Result<Vec<Flow>, String> {
    let page = args.model.page_size;
    args.flows
        .iter()
        .map(|name| {
            let mut fa = FlowArgs {
                flow: name.clone(),
                ..FlowArgs::default()
            };
            if name != "dense" {
                fa.budget = Some(args.budget.div_ceil(page));
            }
            fa.load(args.model.geometry(cfg), cfg.layers)
                .map_err(|e| match fa.budget {
                    Some(_) => format!(
                        "{name}: {e} (--budget {} tokens, in pages of {page} tokens)",
                        args.budget
                    ),
                    None => format!("{name}: {e}"),
                })
        })
        .collect()
}

/// The context measured for `asked`: decoding must fit the model's context of `max_positions`,
/// so a longer one is shortened to leave room for it, with a warning.
fn fitted_context(asked: usize, decode_tokens: usize, max_positions: usize) -> usize {
    let context = asked.min(max_positions - decode_tokens);
    if context < asked {
        eprintln!(
            "warning: --context {asked} and --decode-tokens {decode_tokens} exceed the model's context of {max_positions} tokens; measuring a context of {context} instead"
        );
    }
    context
}

/// `(RssFile, RssAnon)` in bytes from /proc/self/status, where available.
fn resident_memory() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace()
            .nth(1)?
            .parse::<u64>()
            .ok()
            .map(|kb| kb * 1024)
    };
    Some((field("RssFile:")?, field("RssAnon:")?))
}

/// A ratio as `2.50x`, or `-` where there is none.
pub(crate) fn times(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{r:.2}x"))
}
