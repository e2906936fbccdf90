//! The serving engine with its forward passes on the GPU: staggered requests (so steps mix
//! prefill chunks with decodes), some with their own sparse budget or their own flow, against
//! the same engine on the CPU. Skips visibly without a GPU.

#[path = "common/bf16_model.rs"]
mod bf16_model;
mod common;

use std::sync::{Arc, Mutex};

use bf16_model::bf16_model;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use vortex_cuda::PoolDtype;
use vortex_cuda::model::{CudaPass, GpuModel, PoolSpec, StepRecall, WeightSource};
use vortex_engine::{
    Engine, EngineConfig, Event, FinishReason, FlowChoice, Metrics, RequestSpec, StepBudget,
};
use vortex_eval::recall_pass::RecallPass;
use vortex_flow::runner::FlowRunner;
use vortex_flow::{Flow, Geometry};
use vortex_kv::{KvCache, KvDtype, KvGeometry};
use vortex_model::grammar::{Grammar, Matcher};
use vortex_model::loader::LoadedModel;
use vortex_model::model::{KvState, SeqStep};
use vortex_model::sampling::SamplingParams;

const PAGE: usize = 4;
const PAGES: usize = 256;

/// The tiny random chat model with every matrix exactly representable in bf16.
fn model() -> Arc<LoadedModel> {
    let mut m = vortex_model::random::tiny(11);
    m.model = bf16_model(&m.model);
    Arc::new(m)
}

fn flow(m: &LoadedModel, name: &str) -> Flow {
    let c = &m.model.config;
    let g = Geometry {
        heads_q: c.heads_q,
        heads_kv: c.heads_kv,
        head_dim: c.head_dim,
        page_size: PAGE,
    };
    vortex_flow::library::load(name, g).unwrap()
}

fn config(name: &str, decode_ahead: bool) -> EngineConfig {
    EngineConfig {
        max_running: 8,
        budget: StepBudget {
            max_batch_tokens: 64,
            prefill_chunk: 16,
        },
        prefix_caching: true,
        default_flow: name.into(),
        decode_ahead,
    }
}

fn cpu_engine(m: &Arc<LoadedModel>, name: &str) -> Engine {
    let c = &m.model.config;
    let geom = KvGeometry::new(c.heads_kv, c.head_dim, PAGE).unwrap();
    let cache = KvCache::new(geom, KvDtype::Bf16, c.layers, PAGES);
    let kv = KvState::new(cache, FlowRunner::new(flow(m, name)));
    Engine::new(
        m.clone(),
        kv,
        config(name, false),
        Arc::new(Metrics::default()),
    )
}

fn gpu_engine(
    m: &Arc<LoadedModel>,
    dev: vortex_cuda::Device,
    name: &str,
    pages: usize,
    decode_ahead: bool,
) -> (Engine, Arc<Metrics>) {
    gpu_engine_of(m, dev, name, pages, decode_ahead, CudaPass::new)
}

/// [`gpu_engine`] whose forward pass `pass` makes of the GPU model.
fn gpu_engine_of(
    m: &Arc<LoadedModel>,
    dev: vortex_cuda::Device,
    name: &str,
    pages: usize,
    decode_ahead: bool,
    pass: impl FnOnce(GpuModel) -> CudaPass,
) -> (Engine, Arc<Metrics>) {
    let c = &m.model.config;
    let f = flow(m, name);
    let pool = PoolSpec {
        page_size: PAGE,
        num_pages: pages,
        dtype: PoolDtype::Bf16,
    };
    let gpu = GpuModel::new(dev, c.clone(), WeightSource::Model(&m.model), pool, &f).unwrap();
    let geom = KvGeometry::new(c.heads_kv, c.head_dim, PAGE).unwrap();
    let kv = KvState::new(
        KvCache::new(geom, KvDtype::Bf16, 0, pages),
        FlowRunner::new(f),
    );
    let metrics = Arc::new(Metrics::default());
    let e = Engine::with_pass(
        m.clone(),
        Box::new(pass(gpu)),
        kv,
        config(name, decode_ahead),
        metrics.clone(),
    );
    (e, metrics)
}

fn specs(m: &LoadedModel, name: &str) -> Vec<RequestSpec> {
    specs_from(m, name, 0)
}

/// The requests of [`specs`]; with `shared` > 0 every prompt starts with the same `shared`
/// tokens.
fn specs_from(m: &LoadedModel, name: &str, shared: usize) -> Vec<RequestSpec> {
    (0..6u32)
        .map(|i| {
            let mut settings = flow(m, name).settings;
            // Half the requests keep 3 pages of their 10-20: their decodes are sparse.
            if i % 2 == 1 {
                settings.budget = Some(3);
            }
            RequestSpec {
                prompt: (0..(40 + 7 * i))
                    .map(|j| {
                        let from = if (j as usize) < shared { 0 } else { i * 97 };
                        (j.wrapping_mul(2654435761).wrapping_add(from)) % 250 + 1
                    })
                    .collect(),
                sampling: SamplingParams::default(),
                max_tokens: 12,
                stop: vec![],
                stop_tokens: vec![],
                keep_stop: false,
                min_tokens: 0,
                skip_special: true,
                ignore_eos: true,
                flow: None,
                settings,
                logprobs: None,
                prompt_logprobs: None,
                grammar: None,
            }
        })
        .collect()
}

/// The CPU model's logits after `spec`'s prompt (prefilled in the engine's chunks) and then
/// `tokens` decoded one by one with the request's settings.
fn cpu_logits_after(m: &LoadedModel, name: &str, spec: &RequestSpec, tokens: &[u32]) -> Vec<f32> {
    let c = &m.model.config;
    let geom = KvGeometry::new(c.heads_kv, c.head_dim, PAGE).unwrap();
    let cache = KvCache::new(geom, KvDtype::Bf16, c.layers, PAGES);
    let own = spec
        .flow
        .as_ref()
        .map_or_else(|| flow(m, name), |c| c.flow.clone());
    let mut kv = KvState::new(cache, FlowRunner::new(own));
    let mut seq = vortex_kv::Sequence::default();
    let mut state = kv.flow.new_state(c.layers);
    let mut logits = Vec::new();
    let chunks = spec.prompt.chunks(16).chain(tokens.chunks(1));
    for chunk in chunks {
        let mut step = [SeqStep {
            seq: &mut seq,
            state: &mut state,
            settings: &spec.settings,
            tokens: chunk,
        }];
        logits = m.model.forward(&mut kv, &mut step).unwrap().remove(0);
    }
    logits
}

fn run(e: &mut Engine, specs: &[RequestSpec]) -> Vec<Result<Vec<u32>, String>> {
    let mut rxs: Vec<UnboundedReceiver<Event>> = Vec::new();
    for (i, s) in specs.iter().enumerate() {
        let (tx, rx) = unbounded_channel();
        e.submit(s.clone(), tx);
        rxs.push(rx);
        for _ in 0..i {
            e.step();
        }
    }
    let mut steps = 0;
    while !e.is_idle() {
        e.step();
        steps += 1;
        assert!(steps < 10_000, "engine made no progress");
    }
    rxs.iter_mut()
        .map(|rx| {
            let mut tokens = Vec::new();
            while let Ok(ev) = rx.try_recv() {
                match ev {
                    Event::Delta { tokens: t, .. } => tokens.extend(t),
                    Event::Finished { reason, .. } => {
                        assert_eq!(reason, FinishReason::Length);
                        return Ok(tokens);
                    }
                    Event::Failed(e) | Event::Refused(e) => return Err(e),
                }
            }
            Err("did not finish".into())
        })
        .collect()
}

/// Submits every request at once and steps until idle: each request's tokens and end.
fn serve_at_once(e: &mut Engine, specs: &[RequestSpec]) -> Vec<(Vec<u32>, FinishReason)> {
    let mut rxs: Vec<UnboundedReceiver<Event>> = Vec::new();
    for s in specs {
        let (tx, rx) = unbounded_channel();
        e.submit(s.clone(), tx);
        rxs.push(rx);
    }
    while !e.is_idle() {
        e.step();
    }
    rxs.iter_mut()
        .enumerate()
        .map(|(i, rx)| {
            let mut tokens = Vec::new();
            let mut end = None;
            while let Ok(ev) = rx.try_recv() {
                match ev {
                    Event::Delta { tokens: t, .. } => tokens.extend(t),
                    Event::Finished { reason, .. } => end = Some(reason),
                    Event::Failed(e) | Event::Refused(e) => panic!("request {i}: {e}"),
                }
            }
            (
                tokens,
                end.unwrap_or_else(|| panic!("request {i} did not finish")),
            )
        })
        .collect()
}

#[test]
fn gpu_engine_serves_like_the_cpu_engine() {
    serves_like_the_cpu("block_topk");
}

/// Quest's page bounds and lsh's hashed keys, whose scores nearly tie between this model's pages
/// of 4 tokens: with the CPU model's product inputs in f32 the two engines parted; rounded as
/// the GPU's, they give the same greedy tokens (or part at a near tie of two tokens).
#[test]
fn gpu_engine_serves_quest_and_lsh_like_the_cpu_engine() {
    serves_like_the_cpu("quest");
    serves_like_the_cpu("lsh");
}

/// Requests that choose their own flow (h2o's hand-written index phase and state, generated
/// ones, the dense flow with a budget) decode in the same steps, each flow's index phase
/// writing its requests' rows of one sparse table; one flow loaded at start, the others when
/// first chosen.
#[test]
fn gpu_engine_serves_requests_of_several_flows_like_the_cpu_engine() {
    let Some(dev) = common::device_or_skip("gpu_engine_serves_requests_of_several_flows") else {
        return;
    };
    let m = model();
    let mut specs = specs(&m, "block_topk");
    // Requests 1 to 5 keep 3 pages, each with its own flow.
    let chosen = [
        None,
        Some("h2o"),
        Some("dense"),
        Some("streaming"),
        Some("global_local"),
        Some("h2o"),
    ];
    for (s, name) in specs.iter_mut().zip(chosen) {
        if let Some(name) = name {
            s.flow = Some(FlowChoice {
                name: name.into(),
                flow: flow(&m, name),
            });
            s.settings = flow(&m, name).settings;
            s.settings.budget = Some(3);
        }
    }
    let h2o = FlowChoice {
        name: "h2o".into(),
        flow: flow(&m, "h2o"),
    };
    compare_with(&m, dev, "block_topk", &specs, PAGES, &[h2o]);
}

/// Heavy hitters: each request's accumulated mass lives in a device slot from its first pass
/// to its end.
#[test]
fn gpu_engine_serves_h2o_like_the_cpu_engine() {
    serves_like_the_cpu("h2o");
}

/// A GPU pool too small for the requests together: some are preempted and recompute their
/// tokens (the generated ones one a step, through the decode), prompts share a prefix through
/// the cache (a page computed twice is held once), and h2o's state slots go back on
/// preemption.
#[test]
fn gpu_engine_preempts_and_shares_prefixes_like_the_cpu_engine() {
    let Some(dev) = common::device_or_skip("gpu_engine_preempts_and_shares_prefixes") else {
        return;
    };
    let m = model();
    let specs = specs_from(&m, "h2o", 24);
    // 28 pages: each request fits alone (at most 22), and the engine preempts twice.
    let (_, metrics) = compare(&m, dev, "h2o", &specs, 28);
    assert!(metrics.preemptions() > 0, "the pool was meant to run out");
    assert!(
        metrics.prefix_hit_tokens() > 0,
        "the prompts share 24 tokens"
    );
}

/// Gemma 3's layout (every other layer attends to the last 6 positions only and selects no
/// pages): staggered requests, preempted and sharing a prefix, decode on the GPU engine as on
/// the CPU's, dense and with sparse tables (half the requests keep 3 pages), by position
/// (streaming) and by score (block_topk).
#[test]
fn gpu_engine_serves_sliding_window_layers_like_the_cpu_engine() {
    let mut m = vortex_model::random::tiny_gemma(7);
    m.model = bf16_model(&m.model);
    let m = Arc::new(m);
    for name in ["dense", "streaming", "block_topk"] {
        let Some(dev) = common::device_or_skip("gpu_engine_serves_sliding_window_layers") else {
            return;
        };
        let specs = specs_from(&m, name, 24);
        let (_, metrics) = compare(&m, dev, name, &specs, 28);
        assert!(metrics.preemptions() > 0, "the pool was meant to run out");
        assert!(
            metrics.prefix_hit_tokens() > 0,
            "the prompts share 24 tokens"
        );
    }
}

/// Runs the staggered requests on both engines with the flow `name`; returns the GPU engine.
fn serves_like_the_cpu(name: &str) {
    let Some(dev) =
        common::device_or_skip(&format!("gpu_engine_serves_like_the_cpu_engine ({name})"))
    else {
        return;
    };
    let m = model();
    let specs = specs(&m, name);
    compare(&m, dev, name, &specs, PAGES);
}

/// `specs` on the CPU engine and on a GPU engine of `pages` pages: the GPU's greedy tokens
/// must be the CPU's, or near ties of the CPU model (a request with a recall tolerance, whose
/// approximate picks may differ from the CPU's, only runs to its length).
fn compare(
    m: &Arc<LoadedModel>,
    dev: vortex_cuda::Device,
    name: &str,
    specs: &[RequestSpec],
    pages: usize,
) -> (Engine, Arc<Metrics>) {
    compare_with(m, dev, name, specs, pages, &[])
}

/// [`compare`] with `preload` loaded on the GPU engine before any request.
fn compare_with(
    m: &Arc<LoadedModel>,
    dev: vortex_cuda::Device,
    name: &str,
    specs: &[RequestSpec],
    pages: usize,
    preload: &[FlowChoice],
) -> (Engine, Arc<Metrics>) {
    let want = run(&mut cpu_engine(m, name), specs);
    let (mut e, metrics) = gpu_engine(m, dev, name, pages, true);
    e.load_flows(preload).unwrap();
    let got = run(&mut e, specs);
    for (i, s) in specs.iter().enumerate() {
        let (g, w) = (got[i].as_ref().unwrap(), want[i].as_ref().unwrap());
        assert_eq!(g.len(), 12);
        eprintln!("gpu {g:?}\ncpu {w:?}");
        if s.settings.tolerance == 0.0 {
            assert_greedy_like_the_cpu(m, name, s, g, w);
        }
    }
    let pool = metrics.pool();
    assert_eq!(pool.leaked, 0);
    assert_eq!(
        pool.used, pool.cached,
        "only the prefix cache holds pages when idle"
    );
    (e, metrics)
}

/// The GPU's greedy `got` for `spec` must be the CPU's `want`, or part from it only where two
/// tokens nearly tie (the two still round and sum differently): there the CPU model must rank
/// the GPU's token within 1% of the largest logit.
fn assert_greedy_like_the_cpu(
    m: &LoadedModel,
    name: &str,
    spec: &RequestSpec,
    got: &[u32],
    want: &[u32],
) {
    if let Some(k) = (0..got.len()).find(|&k| got[k] != want[k]) {
        let l = cpu_logits_after(m, name, spec, &got[..k]);
        let max = l.iter().copied().fold(f32::MIN, f32::max);
        let scale = l.iter().fold(0f32, |a, v| a.max(v.abs()));
        assert!(
            max - l[got[k] as usize] <= 0.01 * scale,
            "token {k}: the GPU chose {} (CPU logit {}), the CPU {} ({max})",
            got[k],
            l[got[k] as usize],
            want[k]
        );
    }
}

/// Requests that keep their own dense layers and recall tolerance decode in the same steps:
/// layers whose rows differ get a sparse table and attention plan each, and a flow's rows go
/// to one index launch per tolerance. The server's flow ranks with an approximate top-k; the
/// requests that keep tolerance 0 (exact) must decode as on the CPU, the others (whose
/// approximate picks may differ from the CPU's) run to their length beside them.
#[test]
fn gpu_engine_serves_requests_with_their_own_dense_layers_and_tolerance() {
    let Some(dev) = common::device_or_skip("gpu_engine_serves_their_own_dense_layers") else {
        return;
    };
    let src = vortex_flow::library::builtin_source("block_topk")
        .unwrap()
        .replace("flow block_topk", "flow approx_centroids")
        .replace("  topk(score)", "  approx_topk(score)");
    assert!(src.contains("approx_topk"));
    let path = std::env::temp_dir().join(format!("approx_centroids_{}.flow", std::process::id()));
    std::fs::write(&path, src).unwrap();
    let name = path.to_str().unwrap();
    let m = model();
    let mut specs = specs(&m, name);
    let own: [(&[usize], f64); 6] = [
        (&[], 0.0),
        (&[0], 0.0),
        (&[], 0.5),
        (&[1], 0.0),
        (&[0], 0.5),
        (&[0, 1], 0.0),
    ];
    for (s, (dense_layers, tolerance)) in specs.iter_mut().zip(own) {
        // 6 of 10-22 pages: 4 ranked, of which a tolerance of 0.5 must get 2 right.
        s.settings.budget = Some(6);
        s.settings.dense_layers = dense_layers.to_vec();
        s.settings.tolerance = tolerance;
    }
    compare(&m, dev, name, &specs, PAGES);
    std::fs::remove_file(&path).ok();
}

/// The hand-written index phases, h2o's state among them, with their rows in several
/// selections: requests of block_topk and h2o keeping dense layer 0, layer 1 or none.
#[test]
fn gpu_engine_serves_hand_written_flows_with_their_own_dense_layers() {
    let Some(dev) = common::device_or_skip("gpu_engine_serves_hand_written_flows_dense_layers")
    else {
        return;
    };
    let m = model();
    let mut specs = specs(&m, "block_topk");
    let own: [(&[usize], Option<&str>); 6] = [
        (&[0], None),
        (&[], Some("h2o")),
        (&[1], Some("h2o")),
        (&[], None),
        (&[0], Some("h2o")),
        (&[1], None),
    ];
    for (s, (dense_layers, chosen)) in specs.iter_mut().zip(own) {
        if let Some(name) = chosen {
            s.flow = Some(FlowChoice {
                name: name.into(),
                flow: flow(&m, name),
            });
            s.settings = flow(&m, name).settings;
        }
        s.settings.budget = Some(3);
        s.settings.dense_layers = dense_layers.to_vec();
    }
    compare(&m, dev, "block_topk", &specs, PAGES);
}

/// Decoding ahead of the host against reading each step's tokens first, on the same GPU:
/// greedy requests and draws at a temperature (picked on the device from the same seeds), some
/// ending earlier by their length, give the same tokens.
#[test]
fn gpu_engine_decodes_ahead_as_it_reads_each_step() {
    let Some(dev) = common::device_or_skip("gpu_engine_decodes_ahead_as_it_reads_each_step") else {
        return;
    };
    let m = model();
    let mut specs = specs(&m, "block_topk");
    for (i, s) in specs.iter_mut().enumerate() {
        if i % 3 == 1 {
            s.sampling = SamplingParams {
                temperature: 0.7 + 0.1 * i as f32,
                seed: 40 + i as u64,
                ..Default::default()
            };
        }
        s.max_tokens = 8 + 2 * i;
    }
    let serve = |e: &mut Engine| {
        serve_at_once(e, &specs)
            .into_iter()
            .map(|(tokens, end)| {
                assert_eq!(end, FinishReason::Length);
                tokens
            })
            .collect::<Vec<_>>()
    };
    let (mut read, _) = gpu_engine(&m, dev, "block_topk", PAGES, false);
    let want = serve(&mut read);
    drop(read);
    let dev = vortex_cuda::Device::open(0).unwrap();
    let (mut ahead, metrics) = gpu_engine(&m, dev, "block_topk", PAGES, true);
    let got = serve(&mut ahead);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.len(), specs[i].max_tokens);
        assert_eq!(g, w, "request {i}");
    }
    assert!(
        metrics.steps_ahead() > 5,
        "{} steps went ahead",
        metrics.steps_ahead()
    );
    assert_eq!(metrics.pool().leaked, 0);
}

/// Requests held to JSON beside free ones on the GPU engine: the held ones are drawn on the
/// device under their grammar's mask and write JSON, a whole object when they stop. Decoding
/// ahead (the held ones' masks queued once their token in flight is back) gives the tokens of
/// reading each step; a batch of held requests alone goes ahead too.
#[test]
fn gpu_engine_holds_requests_to_json() {
    let Some(dev) = common::device_or_skip("gpu_engine_holds_requests_to_json") else {
        return;
    };
    let m = model();
    let grammar = Arc::new(Grammar::any_object());
    let mut specs = specs(&m, "block_topk");
    for (i, s) in specs.iter_mut().enumerate() {
        s.sampling = SamplingParams {
            temperature: 0.9,
            seed: i as u64,
            ..Default::default()
        };
        s.ignore_eos = false;
        if i % 2 == 0 {
            s.grammar = Some(grammar.clone());
            s.max_tokens = 40;
        } else {
            s.max_tokens = 80;
        }
    }
    let (mut read, _) = gpu_engine(&m, dev, "block_topk", PAGES, false);
    let want = serve_at_once(&mut read, &specs);
    drop(read);
    let dev = vortex_cuda::Device::open(0).unwrap();
    let (mut e, metrics) = gpu_engine(&m, dev, "block_topk", PAGES, true);
    let got = serve_at_once(&mut e, &specs);
    assert_eq!(got, want, "decoding ahead against reading each step");
    let mut stopped_whole = 0;
    for (i, ((tokens, end), s)) in got.iter().zip(&specs).enumerate() {
        let text = m.tokenizer.decode(tokens);
        let end = *end;
        let mut matcher = Matcher::new(grammar.clone());
        let json = matcher.advance(text.as_bytes());
        eprintln!("request {i} ({end:?}): {text:?}");
        if s.grammar.is_some() {
            assert!(json, "request {i}: {text:?}");
            assert_eq!(
                end == FinishReason::Stop,
                matcher.is_complete(),
                "request {i}: {text:?}"
            );
            stopped_whole += usize::from(end == FinishReason::Stop);
        } else {
            assert!(!json, "request {i} writes free text: {text:?}");
        }
    }
    eprintln!("{stopped_whole} of 3 held requests wrote a whole object");
    assert!(metrics.steps_ahead() > 0);
    assert_eq!(metrics.pool().leaked, 0);
    // Held requests alone.
    let held: Vec<RequestSpec> = specs.into_iter().step_by(2).collect();
    let before = metrics.steps_ahead();
    let got = serve_at_once(&mut e, &held);
    assert!(got.iter().all(|(t, _)| !t.is_empty()));
    assert!(
        metrics.steps_ahead() > before,
        "{} steps went ahead with held requests alone",
        metrics.steps_ahead() - before
    );
    assert_eq!(metrics.pool().leaked, 0);
}

/// Requests asking for log-probabilities keep their tokens picked on the device (greedy and at
/// a temperature: the same tokens as without them), decoding ahead, and get log-probabilities
/// scored there: the greedy token first among the best, all of them sorted, and close to the
/// CPU model's.
#[test]
fn gpu_engine_scores_logprobs_on_the_device() {
    let Some(dev) = common::device_or_skip("gpu_engine_scores_logprobs_on_the_device") else {
        return;
    };
    let m = model();
    let mut specs = specs(&m, "block_topk");
    for (i, s) in specs.iter_mut().enumerate() {
        if i % 2 == 1 {
            s.sampling = SamplingParams {
                temperature: 0.8,
                seed: 7 + i as u64,
                ..Default::default()
            };
        }
    }
    let (mut e, _) = gpu_engine(&m, dev, "block_topk", PAGES, true);
    let plain = serve_at_once(&mut e, &specs);
    drop(e);
    // A fresh engine: no prompt page cached from the run above.
    let dev = vortex_cuda::Device::open(0).unwrap();
    let (mut e, metrics) = gpu_engine(&m, dev, "block_topk", PAGES, true);
    let scored_specs: Vec<RequestSpec> = specs
        .iter()
        .map(|s| RequestSpec {
            logprobs: Some(5),
            prompt_logprobs: None,
            ..s.clone()
        })
        .collect();
    let mut rxs: Vec<UnboundedReceiver<Event>> = Vec::new();
    for s in &scored_specs {
        let (tx, rx) = unbounded_channel();
        e.submit(s.clone(), tx);
        rxs.push(rx);
    }
    while !e.is_idle() {
        e.step();
    }
    for (i, rx) in rxs.iter_mut().enumerate() {
        let (mut tokens, mut lps) = (Vec::new(), Vec::new());
        while let Ok(ev) = rx.try_recv() {
            match ev {
                Event::Delta {
                    tokens: t,
                    logprobs,
                    ..
                } => {
                    tokens.extend(t);
                    lps.extend(logprobs);
                }
                Event::Finished { .. } => {}
                Event::Failed(e) | Event::Refused(e) => panic!("request {i}: {e}"),
            }
        }
        assert_eq!(
            tokens, plain[i].0,
            "request {i}: asking for logprobs changed its tokens"
        );
        assert_eq!(lps.len(), tokens.len());
        for (t, lp) in lps.iter().enumerate() {
            assert_eq!(lp.token, tokens[t]);
            assert_eq!(lp.top.len(), 5);
            assert!(lp.logprob <= 1e-6, "{lp:?}");
            assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1), "{lp:?}");
            if i % 2 == 0 {
                assert_eq!(lp.top[0].0, lp.token, "request {i} token {t}: {lp:?}");
                assert!((lp.top[0].1 - lp.logprob).abs() < 1e-6);
            }
        }
        // The first token's against the CPU model's logits after the prompt (bf16 weights on
        // both; the GPU's activations round to bf16 between layers).
        let cpu = vortex_engine::request::token_logprob(
            &cpu_logits_after(&m, "block_topk", &scored_specs[i], &[]),
            tokens[0],
            5,
        );
        assert!(
            (cpu.logprob - lps[0].logprob).abs() < 0.05,
            "request {i}: {} vs the CPU's {}",
            lps[0].logprob,
            cpu.logprob
        );
    }
    // Their picks and log-probabilities come back while the next step runs.
    assert!(metrics.steps_ahead() > 5, "{}", metrics.steps_ahead());
}

/// Prompt log-probabilities (`prompt_logprobs`) scored on the device agree with the CPU
/// engine's: staggered requests, so that prompts are scored in chunks beside other requests'
/// prefill and decode rows; every other request asks for its prompt alone (`max_tokens` 0).
#[test]
fn gpu_engine_scores_prompts_like_the_cpu_engine() {
    let Some(dev) = common::device_or_skip("gpu_engine_scores_prompts_like_the_cpu_engine") else {
        return;
    };
    let m = model();
    let specs: Vec<RequestSpec> = specs(&m, "block_topk")
        .into_iter()
        .enumerate()
        .map(|(i, s)| RequestSpec {
            prompt_logprobs: Some(3),
            max_tokens: if i % 2 == 0 { 0 } else { 4 },
            ..s
        })
        .collect();
    let (mut gpu, _) = gpu_engine(&m, dev, "block_topk", PAGES, true);
    let on_gpu = prompt_scores(&mut gpu, &specs);
    let on_cpu = prompt_scores(&mut cpu_engine(&m, "block_topk"), &specs);
    for (i, (g, c)) in on_gpu.iter().zip(&on_cpu).enumerate() {
        let prompt = &specs[i].prompt;
        assert_eq!(g.len(), prompt.len() - 1, "request {i}");
        assert_eq!(c.len(), prompt.len() - 1, "request {i}");
        for (t, (g, c)) in g.iter().zip(c).enumerate() {
            assert_eq!(g.token, prompt[t + 1]);
            assert_eq!(c.token, g.token);
            // bf16 weights on both; the GPU's activations round to bf16 between layers.
            let near = |a: f32, b: f32| (a - b).abs() < 0.05;
            assert!(
                near(g.logprob, c.logprob),
                "request {i} row {t}: {g:?} {c:?}"
            );
            assert_eq!(g.top.len(), 3);
            assert!(g.top.windows(2).all(|w| w[0].1 >= w[1].1), "{g:?}");
            assert!(
                near(g.top[0].1, c.top[0].1),
                "request {i} row {t}: {g:?} {c:?}"
            );
            for &(id, lp) in &g.top {
                if let Some(&(_, cpu)) = c.top.iter().find(|x| x.0 == id) {
                    assert!(near(lp, cpu), "request {i} row {t} token {id}: {g:?} {c:?}");
                }
            }
        }
    }
}

/// Each request's prompt scores, the requests submitted a step apart.
fn prompt_scores(e: &mut Engine, specs: &[RequestSpec]) -> Vec<Vec<vortex_engine::TokenLogprob>> {
    let mut rxs: Vec<UnboundedReceiver<Event>> = Vec::new();
    for s in specs {
        let (tx, rx) = unbounded_channel();
        e.submit(s.clone(), tx);
        rxs.push(rx);
        e.step();
    }
    while !e.is_idle() {
        e.step();
    }
    rxs.iter_mut()
        .enumerate()
        .map(|(i, rx)| {
            let mut scores = Vec::new();
            while let Ok(ev) = rx.try_recv() {
                match ev {
                    Event::Delta { prompt, .. } => scores.extend(prompt),
                    Event::Finished { .. } => return scores,
                    Event::Failed(e) | Event::Refused(e) => panic!("request {i}: {e}"),
                }
            }
            panic!("request {i} did not finish")
        })
        .collect()
}

/// `vortex serve --recall-every`: one decode pass in three measured on the GPU finds what the
/// CPU's measuring pass finds in the same passes (streaming keeps the same pages on both, so
/// only the two models' arithmetic differs, and the tokens where they nearly tie); block_topk,
/// decoding ahead, measures too.
#[test]
fn gpu_engine_measures_recall_like_the_cpu_engine() {
    let Some(dev) = common::device_or_skip("gpu_engine_measures_recall_like_the_cpu_engine") else {
        return;
    };
    type Seen = Arc<Mutex<Vec<(usize, f64, f64, f64)>>>;
    let m = model();
    let streaming = specs(&m, "streaming");
    let cpu_seen: Seen = Arc::default();
    let log = cpu_seen.clone();
    let c = &m.model.config;
    let geom = KvGeometry::new(c.heads_kv, c.head_dim, PAGE).unwrap();
    let kv = KvState::new(
        KvCache::new(geom, KvDtype::Bf16, c.layers, PAGES),
        FlowRunner::new(flow(&m, "streaming")),
    );
    let report = move |f: &vortex_eval::fidelity::Fidelity| {
        let rows = f.rows as f64;
        let r = (f.rows, f.mass_recall * rows, f.topk_recall * rows);
        log.lock().unwrap().push((r.0, r.1, r.2, f.min_mass_recall));
    };
    let mut cpu = Engine::with_pass(
        m.clone(),
        Box::new(RecallPass::new(3, Box::new(report))),
        kv,
        config("streaming", false),
        Arc::new(Metrics::default()),
    );
    let want = run(&mut cpu, &streaming);
    let measuring = |seen: &Seen| {
        let log = seen.clone();
        move |gpu: GpuModel| {
            CudaPass::new(gpu).measuring(
                3,
                Box::new(move |r: &StepRecall| {
                    let found = (r.rows, r.mass_sum, r.topk_sum, r.lowest_mass);
                    log.lock().unwrap().push(found);
                }),
            )
        }
    };
    let gpu_seen: Seen = Arc::default();
    let (mut e, _) = gpu_engine_of(&m, dev, "streaming", PAGES, false, measuring(&gpu_seen));
    let got = run(&mut e, &streaming);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let (g, w) = (g.as_ref().unwrap(), w.as_ref().unwrap());
        assert_greedy_like_the_cpu(&m, "streaming", &streaming[i], g, w);
    }
    let (cpu_seen, gpu_seen) = (cpu_seen.lock().unwrap(), gpu_seen.lock().unwrap());
    assert!(cpu_seen.len() >= 5, "{cpu_seen:?}");
    assert_eq!(cpu_seen.len(), gpu_seen.len(), "{cpu_seen:?}\n{gpu_seen:?}");
    for (i, (c, g)) in cpu_seen.iter().zip(gpu_seen.iter()).enumerate() {
        eprintln!("cpu {c:?}\ngpu {g:?}");
        assert_eq!(c.0, g.0, "rows measured");
        let rows = c.0 as f64;
        assert!(g.1 / rows > 0.0 && g.1 / rows < 1.0 && g.3 <= g.1 / rows + 1e-6);
        assert!((0.0..=1.0).contains(&(g.2 / rows)));
        // The two models' activations differ (bf16 between the GPU's layers), more so as the
        // requests go on, and tokens that nearly tie may part: only the first measured pass
        // is held to the CPU's numbers. `gpu_page_mass` compares the measure itself on the
        // same inputs.
        if i == 0 {
            assert!((c.1 - g.1).abs() / rows < 0.01, "mass recall {c:?} {g:?}");
            assert!((c.3 - g.3).abs() < 0.01, "lowest mass recall {c:?} {g:?}");
        }
    }
    let mean = |seen: &[(usize, f64, f64, f64)]| {
        let rows: usize = seen.iter().map(|s| s.0).sum();
        seen.iter().map(|s| s.1).sum::<f64>() / rows as f64
    };
    let (c, g) = (mean(&cpu_seen), mean(&gpu_seen));
    assert!(
        (c - g).abs() < 0.05,
        "mean mass recall {c} on the CPU, {g} on the GPU"
    );
    // A flow that ranks pages, its passes queued ahead.
    drop(gpu_seen);
    let dev = common::device_or_skip("gpu_engine_measures_recall_like_the_cpu_engine").unwrap();
    let topk_seen: Seen = Arc::default();
    let (mut e, metrics) = gpu_engine_of(&m, dev, "block_topk", PAGES, true, measuring(&topk_seen));
    run(&mut e, &specs(&m, "block_topk"));
    assert!(metrics.steps_ahead() > 5, "{}", metrics.steps_ahead());
    let topk_seen = topk_seen.lock().unwrap();
    assert!(topk_seen.len() >= 3, "{topk_seen:?}");
    for &(rows, mass, topk, lowest) in topk_seen.iter() {
        let n = rows as f64;
        assert!(
            rows > 0 && mass / n > 0.0 && mass / n <= 1.0 + 1e-6,
            "{topk_seen:?}"
        );
        assert!((0.0..=1.0).contains(&(topk / n)) && lowest <= mass / n + 1e-9);
    }
}
