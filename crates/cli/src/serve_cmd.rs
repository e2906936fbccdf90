//! `vortex serve`: the OpenAI-compatible server over one model.

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use vortex_cuda::Device;
use vortex_cuda::compile::BuildStats;
use vortex_cuda::model::{CudaPass, GpuModel, PoolSpec, WeightSource};
use vortex_engine::{Engine, EngineConfig, EngineHandle, FlowChoice, Metrics, StepBudget};
use vortex_eval::recall_pass::RecallPass;
use vortex_flow::runner::FlowRunner;
use vortex_kv::{KvCache, KvGeometry};
use vortex_model::model::{CpuPass, ForwardPass, KvState};
use vortex_server::AppState;
use vortex_server::admission::Admission;

use crate::device_arg::DeviceArg;
use crate::flow_args::FlowArgs;
use crate::model_args::ModelArgs;

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    flow: FlowArgs,
    /// Where forward passes run: cpu, cuda or cuda:N (the KV pool then lives on the GPU).
    #[arg(long, default_value = "cpu")]
    device: DeviceArg,
    /// Other built-in flows requests may choose (`"vortex": {"flow": NAME}`), comma-separated,
    /// loaded at start: on a GPU whose KV pool fills the memory share, their page summaries
    /// get memory before the pool takes the rest. A flow not named here is loaded when a
    /// request first chooses it, where memory is left for it.
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    flows: Vec<String>,
    /// Instead of --model: seeded random weights of a named geometry (qwen3-0.6b, qwen3-1.7b,
    /// qwen3-4b, qwen3-8b, gemma3-270m, gemma3-1b, gemma3-4b) or of a config.json, with a byte-level tokenizer whose other ids
    /// decode as words " w{id}", to measure a server with nothing to download (on a GPU the
    /// weights are drawn there).
    #[arg(long, conflicts_with = "model")]
    random_weights: Option<String>,
    /// Address to bind (loopback unless told otherwise).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 picks a free one; the address is printed).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Requests in the running batch at most.
    #[arg(long, default_value_t = 32)]
    max_running: usize,
    /// Tokens computed per step, decodes and prefill chunks together (default: the prefill
    /// chunk plus one per running request).
    #[arg(long)]
    max_batch_tokens: Option<usize>,
    /// Memory for the KV pages, e.g. 4GiB or 512MiB (default: 4GiB on the CPU; on a GPU, what
    /// --gpu-memory-utilization leaves).
    #[arg(long, conflicts_with = "kv_pages")]
    kv_memory: Option<String>,
    /// KV pages in the pool (instead of --kv-memory).
    #[arg(long)]
    kv_pages: Option<usize>,
    /// On a GPU, the share of its memory the server may take (default 0.9) when neither
    /// --kv-memory nor --kv-pages is given: the KV pool gets what the weights and the largest
    /// step leave of it.
    #[arg(long, conflicts_with_all = ["kv_memory", "kv_pages"])]
    gpu_memory_utilization: Option<f64>,
    /// Require `Authorization: Bearer KEY` on the /v1 routes, /tokenize and /detokenize.
    #[arg(long)]
    api_key: Option<String>,
    /// Requests held at once, running or waiting; past it a request gets a 503 with
    /// Retry-After (default: no limit).
    #[arg(long)]
    max_requests: Option<usize>,
    /// The model name clients send (default: the model's file name).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Don't share prompt pages between requests.
    #[arg(long)]
    no_prefix_cache: bool,
    /// On a GPU, read each decode step's tokens before queuing the next one (by default the
    /// next step is queued first, and the tokens reach clients one step later).
    #[arg(long)]
    no_decode_ahead: bool,
    /// Read chat replies' reasoning out of their text and return it as `reasoning_content`:
    /// `qwen3` (a reply that opens with <think> reasons until </think>, as Qwen3 and QwQ write).
    #[arg(long, value_parser = ["qwen3"])]
    reasoning_parser: Option<String>,
    /// Measure the recall of the pages sparse attention keeps: one decode step in every N
    /// compares each layer's selection with exact attention over the same KV (a dense step's
    /// work more; on a GPU that step also runs kernel by kernel, without a CUDA graph) and
    /// exports it at /metrics (`vortex_selection_mass_recall`, ...).
    #[arg(long, value_name = "N")]
    recall_every: Option<u64>,
    /// Don't log a line per request.
    #[arg(long)]
    quiet: bool,
}

/// The seed of `--random-weights`.
const RANDOM_SEED: u64 = 1;

/// Parses a size such as `4GiB`, `512MiB`, `1.5G` (K, M, G are binary, as KiB, MiB, GiB), `8GB`
/// (KB, MB, GB are decimal) or a plain number of bytes.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (e.g. 4GiB, 512MiB)"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        other => {
            return Err(format!(
                "unknown size unit '{other}' in '{s}' (use KiB, MiB, GiB, or KB, MB, GB)"
            ));
        }
    };
    let bytes = n * mult;
    if !(bytes.is_finite() && bytes >= 1.0) {
        return Err(format!("size '{s}' is too small"));
    }
    Ok(bytes as usize)
}

/// The most sequences or tokens one step may take.
const STEP_LIMIT: usize = 1 << 24;

pub fn run(args: ServeArgs) -> Result<ExitCode, String> {
    if args.max_running == 0 {
        return Err("--max-running must be at least 1".into());
    }
    if args.model.prefill_chunk < 2 {
        return Err("--prefill-chunk must be at least 2 for serving".into());
    }
    let max_batch_tokens = args
        .max_batch_tokens
        .unwrap_or(args.model.prefill_chunk.saturating_add(args.max_running));
    // A prompt is taken in chunks of 2 or more that never leave one token (a decode) behind:
    // a step of 2 could not take the last 3 of an odd prompt.
    if max_batch_tokens < 3 {
        return Err("--max-batch-tokens must be at least 3".into());
    }
    // Buffers are sized from these before any request: bounded far above any real step.
    for (flag, v) in [
        ("--max-running", args.max_running),
        ("--max-batch-tokens", max_batch_tokens),
        ("--prefill-chunk", args.model.prefill_chunk),
    ] {
        if v > STEP_LIMIT {
            return Err(format!("{flag} {v}: at most {STEP_LIMIT}"));
        }
    }
    // A name (localhost) or an address, IPv6 ones bare (::1) or bracketed.
    let host = args.host.trim_start_matches('[').trim_end_matches(']');
    let addr: SocketAddr = (host, args.port)
        .to_socket_addrs()
        .map_err(|e| format!("--host {}: {e}", args.host))?
        .next()
        .ok_or_else(|| format!("--host {}: no address", args.host))?;
    if args.max_requests == Some(0) {
        return Err("--max-requests must be at least 1".into());
    }
    check_names(&args)?;
    if args.recall_every == Some(0) {
        return Err("--recall-every must be at least 1".into());
    }
    let fp8_weights = args
        .model
        .fp8_weights(matches!(args.device, DeviceArg::Cuda(_)))?;
    // A missing GPU is said before any model is fetched or loaded.
    let gpu = match args.device {
        DeviceArg::Cpu => None,
        DeviceArg::Cuda(ordinal) => Some(Device::open(ordinal).map_err(|e| e.to_string())?),
    };
    match args.gpu_memory_utilization {
        Some(_) if gpu.is_none() => {
            return Err("--gpu-memory-utilization applies to --device cuda".into());
        }
        Some(u) if !(u > 0.0 && u <= 1.0) => {
            return Err(format!(
                "--gpu-memory-utilization {u}: give a share above 0 and at most 1"
            ));
        }
        _ => {}
    }
    let dtype_size = args.model.kv_elem_bytes(gpu.is_some())?;
    let mut loaded = match &args.random_weights {
        Some(g) => args.model.load_random(g, RANDOM_SEED, gpu.is_some())?,
        None => args.model.load()?,
    };
    if gpu.is_none() {
        loaded.model = args.model.for_cpu(loaded.model);
    }
    let cfg = loaded.model.config.clone();
    let geometry = args.model.geometry(&cfg);
    let flow = args.flow.load(geometry, cfg.layers)?;
    let preload = preloaded_flows(&args.flows, &args.flow.flow, geometry)?;
    let preload_defs: Vec<vortex_flow::Flow> = preload.iter().map(|c| c.flow.clone()).collect();
    let geom = KvGeometry::new(cfg.heads_kv, cfg.head_dim, args.model.page_size)
        .map_err(|e| e.to_string())?;
    let page_bytes = cfg.layers * 2 * cfg.heads_kv * cfg.head_dim * geom.page_size * dtype_size;
    let sized = match (&args.kv_pages, &args.kv_memory, &gpu) {
        (Some(p), _, _) => Some(*p),
        (None, Some(m), _) => Some(parse_size(m)? / page_bytes),
        (None, None, None) => Some((4usize << 30) / page_bytes),
        // The GPU's pool is sized once the weights and the largest step are in place.
        (None, None, Some(_)) => None,
    };
    if let Some(pages) = sized {
        if pages < 2 {
            return Err(match args.kv_pages {
                Some(_) => format!("--kv-pages {pages}: the KV pool needs at least 2 pages"),
                None => format!(
                    "the KV pool would hold {pages} pages of {page_bytes} bytes: give it more memory"
                ),
            });
        }
        // Page ids are 32-bit; a host pool must fit in memory (the GPU's allocation fails
        // cleanly).
        if pages > u32::MAX as usize {
            return Err(format!("a KV pool of {pages} pages (at most {})", u32::MAX));
        }
        if gpu.is_none() {
            crate::limits::check_memory(
                &format!("a KV pool of {pages} pages of {page_bytes} bytes"),
                pages.checked_mul(page_bytes),
            )?;
        }
    }
    let default_settings = flow.settings.clone();
    let flow_name = args.flow.flow.clone();
    let engine_cfg = EngineConfig {
        max_running: args.max_running,
        budget: StepBudget {
            max_batch_tokens,
            prefill_chunk: args.model.prefill_chunk,
        },
        prefix_caching: !args.no_prefix_cache,
        default_flow: flow_name.clone(),
        decode_ahead: !args.no_decode_ahead,
    };
    let metrics = Arc::new(Metrics::default());
    let built_before = BuildStats::now();
    let (pass, layers, pages): (Box<dyn ForwardPass>, usize, usize) = match gpu {
        None => {
            let pass: Box<dyn ForwardPass> = match args.recall_every {
                Some(every) => {
                    let m = metrics.clone();
                    Box::new(RecallPass::new(
                        every,
                        Box::new(move |f| {
                            let rows = f.rows as f64;
                            m.selection_measured(
                                f.rows as u64,
                                f.mass_recall * rows,
                                f.topk_recall * rows,
                                f.min_mass_recall,
                            );
                        }),
                    ))
                }
                None => Box::new(CpuPass),
            };
            (pass, cfg.layers, sized.unwrap_or(2))
        }
        Some(dev) => {
            eprintln!("vortex: loading the model onto {}", dev.describe());
            let pool = PoolSpec {
                page_size: args.model.page_size,
                // A small pool until the memory left is known.
                num_pages: sized.unwrap_or(2),
                dtype: args.model.gpu_kv_dtype()?,
            };
            let weights = match args.random_weights {
                Some(_) => WeightSource::Random(RANDOM_SEED),
                None => WeightSource::Model(&loaded.model),
            };
            let mut gpu =
                GpuModel::new(dev, cfg.clone(), weights, pool, &flow).map_err(|e| e.to_string())?;
            if fp8_weights {
                gpu.use_fp8_weights().map_err(|e| e.to_string())?;
            }
            if args.recall_every.is_some() {
                gpu.prepare_recall()
                    .map_err(|e| format!("--recall-every on {}: {e}", gpu.dev.describe()))?;
            }
            // Fail now, not at the first large step, when the pool leaves too little memory.
            let pages = gpu.allocator.total();
            gpu.reserve_steps(max_batch_tokens, args.max_running)
                .map_err(|e| match sized {
                    Some(_) => format!(
                        "no GPU memory left for a step of {max_batch_tokens} tokens beside a KV pool of {pages} pages: lower --kv-memory or --max-batch-tokens ({e})"
                    ),
                    None => format!(
                        "the weights and a step of {max_batch_tokens} tokens do not fit the GPU: lower --max-batch-tokens or --max-running ({e})"
                    ),
                })?;
            let pages = match sized {
                Some(pages) => pages,
                None => {
                    let share = args.gpu_memory_utilization.unwrap_or(0.9);
                    gpu.fill_memory(share, &flow, &preload_defs).map_err(|e| {
                        format!("sizing the KV pool to {share} of the GPU's memory: {e}")
                    })?
                }
            };
            // The host pool only hands out page ids: its layers hold nothing.
            let mut pass = CudaPass::new(gpu);
            if let Some(every) = args.recall_every {
                let m = metrics.clone();
                pass = pass.measuring(
                    every,
                    Box::new(move |r| {
                        m.selection_measured(r.rows as u64, r.mass_sum, r.topk_sum, r.lowest_mass)
                    }),
                );
            }
            (Box::new(pass), 0, pages)
        }
    };
    // The host pool of a GPU model only hands out page ids: its dtype does not matter.
    let host_dtype = match args.device {
        DeviceArg::Cpu => args.model.kv_dtype()?,
        DeviceArg::Cuda(_) => vortex_kv::KvDtype::Bf16,
    };
    let cache = KvCache::new(geom, host_dtype, layers, pages);
    let kv = KvState::for_model(cache, FlowRunner::new(flow), &loaded.model.config);
    let model = Arc::new(loaded);
    let device = pass.device();
    let mut engine = Engine::with_pass(model.clone(), pass, kv, engine_cfg, metrics.clone());
    engine.load_flows(&preload)?;
    if matches!(args.device, DeviceArg::Cuda(_)) {
        // A first start on a machine compiles the kernels; later ones load them.
        eprintln!(
            "vortex: {}",
            BuildStats::now().since(built_before).describe()
        );
    }
    let handle = EngineHandle::spawn(engine, metrics);
    let model_id = args
        .served_model_name
        .clone()
        .unwrap_or_else(|| model.name.clone());
    let mut state = AppState::new(
        handle,
        model,
        model_id.clone(),
        args.api_key.clone(),
        geometry,
        flow_name.clone(),
        default_settings,
        args.quiet,
    );
    state.kv_pool_tokens = pages * geom.page_size;
    state.reasoning = args.reasoning_parser.is_some();
    state.admission = Admission::new(args.max_requests);
    let state = Arc::new(state);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("starting the async runtime: {e}"))?;
    let also = match preload.is_empty() {
        true => String::new(),
        false => {
            let names: Vec<&str> = preload.iter().map(|c| c.name.as_str()).collect();
            format!(" (also {})", names.join(", "))
        }
    };
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("binding {addr}: {e}"))?;
        let bound = listener.local_addr().map_err(|e| e.to_string())?;
        eprintln!(
            "vortex: serving '{model_id}' on http://{bound} ({device}, flow {flow_name}{also}, {pages} KV pages of {} tokens, max {} running)",
            geom.page_size, args.max_running
        );
        vortex_server::serve(listener, state)
            .await
            .map_err(|e| format!("server: {e}"))
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `--api-key` and `--served-model-name`, which clients must be able to send back.
fn check_names(args: &ServeArgs) -> Result<(), String> {
    match &args.api_key {
        Some(key) if key.is_empty() => return Err("--api-key is empty".into()),
        Some(key) if key.trim() != key => {
            return Err("--api-key: give a key with no leading or trailing spaces".into());
        }
        _ => {}
    }
    if args
        .served_model_name
        .as_ref()
        .is_some_and(|n| n.trim().is_empty())
    {
        return Err("--served-model-name is empty or only spaces".into());
    }
    Ok(())
}

/// The built-in flows of `--flows`, compiled for the model, without the default one.
fn preloaded_flows(
    names: &[String],
    default: &str,
    geometry: vortex_flow::Geometry,
) -> Result<Vec<FlowChoice>, String> {
    let mut flows: Vec<FlowChoice> = Vec::new();
    for name in names.iter().map(|n| n.trim()) {
        if name == default || flows.iter().any(|f| f.name == name) {
            continue;
        }
        if vortex_flow::library::builtin_source(name).is_none() {
            let known: Vec<&str> = vortex_flow::library::BUILTIN.iter().map(|b| b.0).collect();
            return Err(format!(
                "--flows: '{name}' is not a built-in flow (requests choose among {})",
                known.join(", ")
            ));
        }
        let flow = vortex_flow::library::load(name, geometry)
            .map_err(|e| format!("--flows: flow '{name}': {e}"))?;
        flows.push(FlowChoice {
            name: name.to_string(),
            flow,
        });
    }
    Ok(flows)
}

#[cfg(test)]
mod tests {
    use super::{parse_size, preloaded_flows};

    #[test]
    fn preloaded_flows_are_built_ins_other_than_the_default() {
        let g = vortex_flow::Geometry {
            heads_q: 4,
            heads_kv: 2,
            head_dim: 16,
            page_size: 16,
        };
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let got = preloaded_flows(
            &names(&["quest", "block_topk", "h2o", "quest"]),
            "block_topk",
            g,
        )
        .unwrap();
        let got: Vec<&str> = got.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(got, ["quest", "h2o"]);
        let err = preloaded_flows(&names(&["quest", "nope"]), "block_topk", g).unwrap_err();
        assert!(err.contains("'nope' is not a built-in flow"), "{err}");
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert_eq!(parse_size("8GB"), Ok(8_000_000_000));
        assert_eq!(parse_size("2kb"), Ok(2000));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("4TB").is_err());
        assert!(parse_size("0").is_err());
    }
}
