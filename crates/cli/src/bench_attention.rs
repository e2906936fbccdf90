//! `vortex bench attention`: CPU decode attention per step, dense against every flow, compared
//! with the machine's read bandwidth measured in the same run.

use std::hint::black_box;
use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::Serialize;
use vortex_flow::explain::FlowCost;
use vortex_flow::library::{BUILTIN, load};
use vortex_flow::runner::{FlowRunner, StepSeq};
use vortex_flow::{Flow, Settings};
use vortex_kernels::attention::decode_attention;
use vortex_kernels::bandwidth::measure_read_bandwidth;
use vortex_kernels::simd::{Level, Simd, bf16_pairs};
use vortex_kv::{KvCache, KvDtype, KvGeometry, PageTable, Sequence};

use crate::GeometryArgs;
use crate::device_arg::DeviceArg;

#[derive(Args)]
pub struct AttentionArgs {
    /// Where attention runs: cpu, cuda or cuda:N (dense paged attention on the GPU, and each sparse
    /// flow's step: index phase and attention over the pages it keeps).
    #[arg(long, default_value = "cpu")]
    pub(crate) device: DeviceArg,
    /// Sequences per step.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    pub(crate) batch: Vec<usize>,
    /// Context lengths in tokens (suffix k = 1024).
    #[arg(long, value_delimiter = ',', default_value = "16k,32k,64k", value_parser = parse_tokens)]
    pub(crate) context: Vec<usize>,
    /// Page budgets of the sparse flows, in tokens (suffix k = 1024).
    #[arg(long, value_delimiter = ',', default_value = "2k", value_parser = parse_tokens)]
    pub(crate) budget: Vec<usize>,
    /// Flows to compare with dense, by name or file ("all" = every built-in; on a GPU, those
    /// with hand-written index phases).
    #[arg(long, value_delimiter = ',', default_value = "all")]
    pub(crate) flows: Vec<String>,
    /// KV cache storage types: f32, f16, bf16, fp8 (e4m3) on the CPU; one of bf16 and fp8 on
    /// the GPU, which skips the others.
    #[arg(long, value_delimiter = ',', default_value = "f32,bf16",
          value_parser = ["f32", "f16", "bf16", "fp8"])]
    pub(crate) kv_dtype: Vec<String>,
    #[command(flatten)]
    pub(crate) geometry: GeometryArgs,
    /// Timed rounds over all layers per configuration (the median is reported).
    #[arg(long, default_value_t = 7)]
    pub(crate) iters: usize,
    /// GPU runs: launches timed back to back between two events, the time reported per launch
    /// (1: an event pair around each; more, as a model's layers run, lets each launch begin
    /// while the one before drains).
    #[arg(long, default_value_t = 1)]
    pub(crate) launches_per_timing: usize,
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// GPU runs: give sequence s of a batch of b (s + 1) / b of the context instead of all of it.
    #[arg(long)]
    pub(crate) ragged: bool,
    /// GPU runs: give each sequence consecutive pool pages, as a prefill does, instead of
    /// pages shuffled over the pool.
    #[arg(long)]
    pub(crate) sequential_pages: bool,
    /// GPU runs: idle this long before each sparse flow's steps, so that none runs while the
    /// power controller still holds the clocks down after the dense runs.
    #[arg(long, default_value_t = 0)]
    pub(crate) settle_ms: u64,
    /// Also write the JSON report to this file (GPU runs).
    #[arg(long)]
    pub(crate) json_out: Option<std::path::PathBuf>,
    /// GPU runs: blocks that score one row of the index phase together, 1 to 8, in a cluster
    /// (1: a block a row; default: as a model's step plans it). Generated index phases run in
    /// passes (state, page-combining operators), and double_sparse's tensor-core index, keep
    /// one block a row.
    #[arg(long)]
    pub(crate) index_parts: Option<u32>,
}

/// The most tokens a length flag takes (16384k).
const MAX_TOKENS: usize = 1 << 24;
/// The most launches `--launches-per-timing` times together.
const MAX_LAUNCHES_PER_TIMING: usize = 1000;

/// A flow's settings at a budget of `budget_tokens` (dense keeps its own); a budget below the
/// flow's sink and recent pages is refused, as everywhere else.
pub(crate) fn sparse_settings(flow: &Flow, budget_tokens: usize) -> Result<Settings, String> {
    let mut settings = flow.settings.clone();
    if flow.name != "dense" {
        settings.budget = Some(budget_tokens.div_ceil(flow.geometry.page_size));
        settings.budget_ratio = None;
        settings
            .check()
            .map_err(|e| format!("{} at --budget {budget_tokens}: {e}", flow.name))?;
    }
    Ok(settings)
}

pub fn parse_tokens(s: &str) -> Result<usize, String> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = match t.strip_suffix('k') {
        Some(n) => (n, 1024),
        None => (t.as_str(), 1),
    };
    match num.parse::<usize>().ok().and_then(|n| n.checked_mul(mult)) {
        Some(n) if n > 0 && n <= MAX_TOKENS => Ok(n),
        _ => Err(format!(
            "'{s}' is not a token count from 1 to {MAX_TOKENS} (e.g. 2048 or 32k)"
        )),
    }
}

#[derive(Serialize)]
struct Row {
    kv_dtype: String,
    batch: usize,
    context: usize,
    budget_tokens: usize,
    flow: String,
    step_ms: f64,
    index_ms: f64,
    attention_ms: f64,
    index_share: f64,
    bytes: usize,
    gbps: f64,
    bandwidth_share: f64,
    speedup_vs_dense: f64,
    bytes_floor_speedup: f64,
}

pub fn run(args: AttentionArgs) -> Result<ExitCode, String> {
    if args.iters == 0 || args.launches_per_timing == 0 || args.batch.contains(&0) {
        return Err("--iters, --launches-per-timing and --batch must be at least 1".into());
    }
    if let Some(b) = args.batch.iter().find(|&&b| b > MAX_TOKENS) {
        return Err(format!("--batch {b}: at most {MAX_TOKENS}"));
    }
    if args.launches_per_timing > MAX_LAUNCHES_PER_TIMING {
        return Err(format!(
            "--launches-per-timing {}: at most {MAX_LAUNCHES_PER_TIMING}",
            args.launches_per_timing
        ));
    }
    let most_parts = vortex_cuda::index_row::MAX_PARTS;
    if let Some(p) = args.index_parts
        && !(1..=most_parts).contains(&p)
    {
        return Err(format!("--index-parts {p}: from 1 to {most_parts}"));
    }
    if let DeviceArg::Cuda(ordinal) = args.device {
        return crate::bench_cuda::run(&args, ordinal);
    }
    if args.ragged
        || args.sequential_pages
        || args.json_out.is_some()
        || args.settle_ms > 0
        || args.index_parts.is_some()
    {
        return Err(
            "--ragged, --sequential-pages, --json-out, --settle-ms and --index-parts apply to --device cuda"
                .into(),
        );
    }
    if let Some(t) = args.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(crate::limits::check_threads(t)?)
            .build_global()
            .map_err(|e| e.to_string())?;
    }
    let g = args.geometry.geometry()?;
    let mut flows: Vec<String> = if args.flows.iter().any(|f| f == "all") {
        BUILTIN.iter().map(|(n, _)| n.to_string()).collect()
    } else {
        args.flows.clone()
    };
    flows.retain(|f| f != "dense");
    let mut runners = vec![FlowRunner::new(
        load("dense", g).map_err(|e| e.to_string())?,
    )];
    for f in &flows {
        runners.push(FlowRunner::new(load(f, g).map_err(|e| e.to_string())?));
    }
    for r in &runners {
        for &budget in &args.budget {
            sparse_settings(&r.flow, budget)?;
        }
    }
    let bandwidth = measure_read_bandwidth(1 << 30, 5);
    let threads = rayon::current_num_threads();
    let simd = Simd::detect().level();
    // Whether a bf16 pool's products run on bf16 pairs (`vdpbf16ps`) here, as decode attention
    // takes them.
    let pairs = simd == Level::Avx512 && bf16_pairs() && g.head_dim.is_multiple_of(32);
    if !args.json {
        println!(
            "read bandwidth {bandwidth:.1} GB/s ({threads} threads, {} kernels{}); geometry {}q/{}kv heads, head_dim {}, page {}",
            simd.name(),
            if pairs {
                ", bf16 pools on bf16 pairs"
            } else {
                ""
            },
            g.heads_q,
            g.heads_kv,
            g.head_dim,
            g.page_size
        );
    }
    let mut rows = Vec::new();
    let dtypes = args
        .kv_dtype
        .iter()
        .map(|s| s.parse::<KvDtype>().map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    for &dtype in &dtypes {
        for &batch in &args.batch {
            for &context in &args.context {
                let setup = Setup::new(
                    g.heads_q,
                    g.heads_kv,
                    g.head_dim,
                    g.page_size,
                    dtype,
                    batch,
                    context,
                )?;
                for &budget in &args.budget {
                    let mut dense_ms = 0.0;
                    let mut dense_bytes = 0;
                    for runner in &runners {
                        let settings = sparse_settings(&runner.flow, budget)?;
                        let r = setup.measure(runner, &settings, args.iters);
                        if runner.flow.name == "dense" {
                            dense_ms = r.0 + r.1;
                            dense_bytes = r.2;
                        }
                        let (index_ms, attention_ms, bytes) = r;
                        let step_ms = index_ms + attention_ms;
                        let gbps = bytes as f64 / (step_ms * 1e-3) / 1e9;
                        rows.push(Row {
                            kv_dtype: dtype.to_string(),
                            batch,
                            context,
                            budget_tokens: budget,
                            flow: runner.flow.name.clone(),
                            step_ms,
                            index_ms,
                            attention_ms,
                            index_share: index_ms / step_ms,
                            bytes,
                            gbps,
                            bandwidth_share: gbps / bandwidth,
                            speedup_vs_dense: dense_ms / step_ms,
                            bytes_floor_speedup: dense_bytes as f64 / bytes as f64,
                        });
                        if !args.json {
                            print_row(rows.last().unwrap(), rows.len() == 1);
                        }
                    }
                }
            }
        }
    }
    if args.json {
        let v = serde_json::json!({"bandwidth_gbps": bandwidth, "threads": threads, "simd": simd.name(), "bf16_pairs": pairs, "rows": rows});
        println!("{}", serde_json::to_string_pretty(&v).unwrap());
    }
    Ok(ExitCode::SUCCESS)
}

fn print_row(r: &Row, header: bool) {
    if header {
        println!(
            "{:<5} {:>5} {:>7} {:>7} {:<14} {:>9} {:>9} {:>6} {:>9} {:>9} {:>7} {:>6} {:>8} {:>7}",
            "kv",
            "batch",
            "context",
            "budget",
            "flow",
            "step ms",
            "index ms",
            "index%",
            "attn ms",
            "MB",
            "GB/s",
            "%bw",
            "speedup",
            "floor"
        );
    }
    println!(
        "{:<5} {:>5} {:>7} {:>7} {:<14} {:>9.3} {:>9.3} {:>5.1}% {:>9.3} {:>9.2} {:>7.1} {:>5.1}% {:>7.2}x {:>6.2}x",
        r.kv_dtype,
        r.batch,
        r.context,
        r.budget_tokens,
        r.flow,
        r.step_ms,
        r.index_ms,
        100.0 * r.index_share,
        r.attention_ms,
        r.bytes as f64 / 1e6,
        r.gbps,
        100.0 * r.bandwidth_share,
        r.speedup_vs_dense,
        r.bytes_floor_speedup
    );
}

/// Last-level cache of the machines this runs on (32 MiB here); only sizes the layer count.
const LLC_BYTES: usize = 32 << 20;

/// One KV cache filled with random keys and values for `batch` sequences of `context` tokens.
struct Setup {
    cache: KvCache,
    seqs: Vec<Sequence>,
    q: Vec<f32>,
    heads_q: usize,
    dtype: KvDtype,
}

impl Setup {
    fn new(
        heads_q: usize,
        heads_kv: usize,
        head_dim: usize,
        page_size: usize,
        dtype: KvDtype,
        batch: usize,
        context: usize,
    ) -> Result<Self, String> {
        let geom = KvGeometry::new(heads_kv, head_dim, page_size).map_err(|e| e.to_string())?;
        let pages = batch
            .checked_mul(geom.pages_for(context))
            .ok_or("--batch times --context is past what can be counted")?;
        // Enough layers that one round of sparse steps (about a tenth of the KV) overflows the
        // last-level cache, as it does in a model: no layer's data is still cached when it runs.
        let layer_bytes = pages.saturating_mul(geom.page_elems() * 2 * dtype.size());
        let layers = (LLC_BYTES * 40 / layer_bytes.max(1)).clamp(2, 8);
        // The queries and the outputs, f32.
        let q_bytes = batch
            .checked_mul(heads_q)
            .and_then(|n| n.checked_mul(head_dim))
            .and_then(|n| n.checked_mul(2 * 4));
        crate::limits::check_memory(
            &format!("a KV cache of {batch} x {context} tokens, {layers} layers"),
            layer_bytes
                .checked_mul(layers)
                .zip(q_bytes)
                .and_then(|(a, b)| a.checked_add(b)),
        )?;
        let mut cache = KvCache::new(geom, dtype, layers, pages);
        let mut rng = StdRng::seed_from_u64(7);
        let width = heads_kv * head_dim;
        let mut k = vec![0.0f32; width];
        let mut v = vec![0.0f32; width];
        let mut seqs = Vec::new();
        for _ in 0..batch {
            let mut seq = Sequence::default();
            let slots = cache.append(&mut seq, context).map_err(|e| e.to_string())?;
            for slot in slots {
                k.iter_mut()
                    .for_each(|x| *x = rng.random::<f32>() * 2.0 - 1.0);
                v.iter_mut()
                    .for_each(|x| *x = rng.random::<f32>() * 2.0 - 1.0);
                cache
                    .layer_mut(0)
                    .write_token(slot.page, slot.offset, &k, &v)
                    .map_err(|e| e.to_string())?;
            }
            seqs.push(seq);
        }
        let first = cache.layer(0).clone();
        for l in 1..layers {
            let layer = cache.layer_mut(l);
            layer.k.copy_from(&first.k).map_err(|e| e.to_string())?;
            layer.v.copy_from(&first.v).map_err(|e| e.to_string())?;
        }
        let q = (0..batch * heads_q * head_dim)
            .map(|_| rng.random::<f32>() * 2.0 - 1.0)
            .collect();
        Ok(Self {
            cache,
            seqs,
            q,
            heads_q,
            dtype,
        })
    }

    /// Median index-phase ms, median attention ms, and bytes one step moves.
    fn measure(&self, runner: &FlowRunner, settings: &Settings, iters: usize) -> (f64, f64, usize) {
        let g = runner.flow.geometry;
        let layers = self.cache.num_layers();
        let complete: Vec<u32> = self
            .seqs
            .iter()
            .flat_map(|s| s.pages[..s.complete_pages(g.page_size)].iter().copied())
            .collect();
        let fields: Vec<_> = (0..layers)
            .map(|l| {
                let mut f = runner.new_fields(self.cache.allocator().total());
                runner.summarize(self.cache.layer(l), &mut f, &complete);
                f
            })
            .collect();
        let mut states: Vec<_> = self.seqs.iter().map(|_| runner.new_state(layers)).collect();
        let mut out = vec![0.0f32; self.q.len()];
        let mut table = PageTable::default();
        let scale = 1.0 / (g.head_dim as f32).sqrt();
        let (mut index_t, mut attn_t) = (Vec::new(), Vec::new());
        // One warm-up round, then `iters` timed rounds over every layer; per-step times are the
        // round's total divided by the layers.
        for round in 0..=iters {
            let (mut index_s, mut attn_s) = (0.0, 0.0);
            for (l, fields) in fields.iter().enumerate() {
                let mut batch: Vec<StepSeq> = self
                    .seqs
                    .iter()
                    .zip(states.iter_mut())
                    .map(|(seq, st)| StepSeq {
                        seq,
                        settings,
                        state: Some(&mut st.layers[l]),
                    })
                    .collect();
                let t0 = Instant::now();
                runner.select(l, fields, &self.q, &mut batch, &mut table);
                let t1 = Instant::now();
                decode_attention(
                    self.cache.layer(l),
                    &table,
                    &self.q,
                    self.heads_q,
                    scale,
                    &mut out,
                )
                .expect("bench shapes are consistent");
                let t2 = Instant::now();
                black_box(&out);
                index_s += (t1 - t0).as_secs_f64();
                attn_s += (t2 - t1).as_secs_f64();
            }
            if round > 0 {
                index_t.push(index_s * 1e3 / layers as f64);
                attn_t.push(attn_s * 1e3 / layers as f64);
            }
        }
        let kv_token = 2 * g.head_dim * self.dtype.size();
        let attention_bytes: usize = (0..table.rows())
            .map(|r| table.tokens(r, g.page_size) * kv_token)
            .sum::<usize>()
            * if table.rows_per_seq == 1 {
                g.heads_kv
            } else {
                1
            };
        let cost = FlowCost::of(&runner.flow, self.dtype);
        let sparse = self
            .seqs
            .iter()
            .filter(|s| !settings.is_dense(0, s.len, s.pages.len()));
        let index_bytes: usize = sparse
            .map(|s| {
                s.complete_pages(g.page_size)
                    * (cost.index_read_per_page + cost.index_write_per_page)
            })
            .sum();
        (
            median(&mut index_t),
            median(&mut attn_t),
            attention_bytes + index_bytes,
        )
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
