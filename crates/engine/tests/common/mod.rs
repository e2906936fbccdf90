//! What the engine's test suites share: a tiny random model, an engine over it and requests.
#![allow(dead_code)]

use std::sync::Arc;

use tokio::sync::mpsc::UnboundedReceiver;
use vortex_engine::{Engine, EngineConfig, Event, FinishReason, Metrics, RequestSpec, StepBudget};
use vortex_flow::runner::FlowRunner;
use vortex_flow::{Geometry, Settings};
use vortex_kv::{KvCache, KvDtype, KvGeometry};
use vortex_model::loader::LoadedModel;
use vortex_model::model::{CpuPass, ForwardPass, KvState};
use vortex_model::sampling::SamplingParams;

pub const PAGE: usize = 4;

pub fn model() -> Arc<LoadedModel> {
    Arc::new(vortex_model::random::tiny(7))
}

pub fn geometry(m: &LoadedModel) -> Geometry {
    let c = &m.model.config;
    Geometry {
        heads_q: c.heads_q,
        heads_kv: c.heads_kv,
        head_dim: c.head_dim,
        page_size: PAGE,
    }
}

/// An engine of dense attention over `pages` pages whose passes run on `pass`.
pub fn engine_on(
    m: &Arc<LoadedModel>,
    pass: Box<dyn ForwardPass>,
    pages: usize,
    max_running: usize,
    decode_ahead: bool,
) -> (Engine, Arc<Metrics>) {
    engine_storing(m, pass, pages, max_running, decode_ahead, KvDtype::F32)
}

/// [`engine_on`] with its pool storing `dtype`.
pub fn engine_storing(
    m: &Arc<LoadedModel>,
    pass: Box<dyn ForwardPass>,
    pages: usize,
    max_running: usize,
    decode_ahead: bool,
    dtype: KvDtype,
) -> (Engine, Arc<Metrics>) {
    let c = &m.model.config;
    let geom = KvGeometry::new(c.heads_kv, c.head_dim, PAGE).unwrap();
    let cache = KvCache::new(geom, dtype, c.layers, pages);
    let flow = vortex_flow::library::load("dense", geometry(m)).unwrap();
    let kv = KvState::new(cache, FlowRunner::new(flow));
    let metrics = Arc::new(Metrics::default());
    let cfg = EngineConfig {
        max_running,
        budget: StepBudget {
            max_batch_tokens: 64,
            prefill_chunk: 16,
        },
        prefix_caching: true,
        default_flow: "dense".into(),
        decode_ahead,
    };
    let e = Engine::with_pass(m.clone(), pass, kv, cfg, metrics.clone());
    (e, metrics)
}

/// An engine over `pages` pages whose passes run on the CPU.
pub fn engine(m: &Arc<LoadedModel>, pages: usize, max_running: usize) -> (Engine, Arc<Metrics>) {
    engine_on(m, Box::new(CpuPass), pages, max_running, true)
}

/// Submits every request of `specs`, in order; their events arrive on the receivers returned.
pub fn submit_all(e: &mut Engine, specs: &[RequestSpec]) -> Vec<UnboundedReceiver<Event>> {
    specs
        .iter()
        .map(|s| {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            e.submit(s.clone(), tx);
            rx
        })
        .collect()
}

/// A request's tokens when it runs alone.
pub fn run_alone(m: &Arc<LoadedModel>, s: RequestSpec) -> Vec<u32> {
    let (mut e, _) = engine(m, 256, 1);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    e.submit(s, tx);
    run_all(&mut e);
    collect(&mut rx).0
}

pub fn spec(prompt: &[u32], max_tokens: usize) -> RequestSpec {
    RequestSpec {
        prompt: prompt.to_vec(),
        sampling: SamplingParams::default(),
        max_tokens,
        stop: vec![],
        stop_tokens: vec![],
        keep_stop: false,
        min_tokens: 0,
        skip_special: true,
        ignore_eos: true,
        flow: None,
        settings: Settings::default(),
        logprobs: None,
        prompt_logprobs: None,
        grammar: None,
    }
}

pub fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed * 97)) % 250 + 1)
        .collect()
}

/// Tokens, finish reason and usage of a finished request.
pub fn collect(rx: &mut UnboundedReceiver<Event>) -> (Vec<u32>, FinishReason, usize) {
    let mut tokens = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        match ev {
            Event::Delta { tokens: t, .. } => tokens.extend(t),
            Event::Finished { reason, usage, .. } => return (tokens, reason, usage.cached_tokens),
            Event::Failed(e) | Event::Refused(e) => panic!("request failed: {e}"),
        }
    }
    panic!("request did not finish");
}

pub fn run_all(e: &mut Engine) {
    let mut steps = 0;
    while !e.is_idle() {
        e.step();
        steps += 1;
        assert!(steps < 10_000, "engine made no progress");
    }
}
