//! The engine loop on a tiny random model, stepped by hand: batching does not change greedy
//! outputs, preempted requests finish with the same text, the prefix cache shares pages, and
//! cancelled requests give their pages back.

mod common;

use std::sync::Arc;

use common::*;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use vortex_engine::{
    Engine, EngineConfig, Event, FinishReason, FlowChoice, Metrics, RequestSpec, StepBudget,
};
use vortex_flow::Settings;
use vortex_flow::runner::FlowRunner;
use vortex_kv::{KvCache, KvDtype, KvGeometry};
use vortex_model::loader::LoadedModel;
use vortex_model::model::{CpuPass, KvState, Wants};
use vortex_model::sampling::SamplingParams;

#[test]
fn batched_greedy_outputs_equal_each_request_alone() {
    let m = model();
    let specs: Vec<RequestSpec> = (0..6)
        .map(|i| spec(&prompt(i, 5 + 7 * i as usize), 12))
        .collect();
    let alone: Vec<Vec<u32>> = specs.iter().map(|s| run_alone(&m, s.clone())).collect();
    let (mut e, metrics) = engine(&m, 256, 8);
    let mut rxs = Vec::new();
    for (i, s) in specs.iter().enumerate() {
        let (tx, rx) = unbounded_channel();
        e.submit(s.clone(), tx);
        rxs.push(rx);
        // Requests arrive while others are mid-prefill or decoding.
        for _ in 0..i {
            e.step();
        }
    }
    run_all(&mut e);
    for (rx, want) in rxs.iter_mut().zip(&alone) {
        let (got, reason, _) = collect(rx);
        assert_eq!(&got, want);
        assert_eq!(reason, FinishReason::Length);
    }
    assert_eq!(metrics.outcome("length"), 6);
    let pool = metrics.pool();
    assert_eq!(pool.leaked, 0);
    assert_eq!(
        pool.used, pool.cached,
        "only the prefix cache holds pages when idle"
    );
}

/// A bf16 pool, whose prefill rounds queries and weights to bf16 in the blocks of keys a query
/// sees whole, and prompts past the first such block: a request cut into other chunks because
/// others share its steps gets the same tokens and log-probabilities, to the bit, as alone.
#[test]
fn bf16_outputs_do_not_depend_on_how_prompts_are_cut() {
    let m = model();
    let specs: Vec<RequestSpec> = (0..3)
        .map(|i| RequestSpec {
            logprobs: Some(2),
            ..spec(&prompt(30 + i, 290 + 23 * i as usize), 6)
        })
        .collect();
    let outputs = |together: bool| {
        let (mut e, _) = engine_storing(&m, Box::new(CpuPass), 512, 4, true, KvDtype::Bf16);
        let mut rxs = Vec::new();
        for (i, s) in specs.iter().enumerate() {
            let (tx, rx) = unbounded_channel();
            e.submit(s.clone(), tx);
            rxs.push(rx);
            // Alone, each runs to its end; together, each arrives mid-prefill of the others.
            for _ in 0..if together { 3 + 5 * i } else { 10_000 } {
                if e.is_idle() {
                    break;
                }
                e.step();
            }
        }
        run_all(&mut e);
        rxs.iter_mut().map(logprobs_of).collect::<Vec<_>>()
    };
    assert_eq!(outputs(true), outputs(false));
}

/// The same requests on 1, 3 and 16 threads give the same tokens and log-probabilities to the
/// bit: threads share out the work, they do not change how it is cut. Every page is attended,
/// so decode rows are long enough to be cut into chunks.
#[test]
fn bf16_outputs_do_not_depend_on_the_thread_count() {
    let m = model();
    let specs: Vec<RequestSpec> = (0..3)
        .map(|i| RequestSpec {
            logprobs: Some(2),
            settings: Settings {
                budget_ratio: Some(1.0),
                ..Settings::default()
            },
            ..spec(&prompt(40 + i, 700 + 97 * i as usize), 6)
        })
        .collect();
    let outputs = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let (mut e, _) = engine_storing(&m, Box::new(CpuPass), 1024, 4, true, KvDtype::Bf16);
            let mut rxs = submit_all(&mut e, &specs);
            run_all(&mut e);
            rxs.iter_mut().map(logprobs_of).collect::<Vec<_>>()
        })
    };
    let one = outputs(1);
    assert_eq!(outputs(3), one);
    assert_eq!(outputs(16), one);
}

/// Each token and its log-probability (as bits) of a finished request.
fn logprobs_of(rx: &mut UnboundedReceiver<Event>) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        match ev {
            Event::Delta { logprobs, .. } => {
                out.extend(logprobs.iter().map(|l| (l.token, l.logprob.to_bits())))
            }
            Event::Finished { .. } => return out,
            Event::Failed(e) | Event::Refused(e) => panic!("request failed: {e}"),
        }
    }
    panic!("request did not finish");
}

#[test]
fn preempted_requests_finish_with_the_same_output() {
    let m = model();
    let specs: Vec<RequestSpec> = (0..4).map(|i| spec(&prompt(10 + i, 20), 24)).collect();
    preemption_keeps_outputs(&m, &specs);
}

/// `specs` together in 20 pages, where 4 requests of up to 44 tokens (44 pages) must preempt:
/// each finishes as it does alone.
fn preemption_keeps_outputs(m: &Arc<LoadedModel>, specs: &[RequestSpec]) {
    let alone: Vec<Vec<u32>> = specs.iter().map(|s| run_alone(m, s.clone())).collect();
    let (mut e, metrics) = engine(m, 20, 4);
    let mut rxs = submit_all(&mut e, specs);
    run_all(&mut e);
    assert!(metrics.preemptions() > 0, "the pool was meant to run out");
    for (rx, want) in rxs.iter_mut().zip(&alone) {
        assert_eq!(&collect(rx).0, want);
    }
    assert_eq!(metrics.pool().leaked, 0);
}

#[test]
fn shared_prefixes_hit_the_cache_without_changing_outputs() {
    let m = model();
    let shared = prompt(3, 40);
    let mut second = shared.clone();
    second.extend(prompt(4, 6));
    let want = run_alone(&m, spec(&second, 10));
    let (mut e, metrics) = engine(&m, 256, 4);
    let (tx, mut rx) = unbounded_channel();
    e.submit(spec(&shared, 4), tx);
    run_all(&mut e);
    assert_eq!(collect(&mut rx).2, 0, "nothing cached yet");
    let (tx, mut rx) = unbounded_channel();
    e.submit(spec(&second, 10), tx);
    run_all(&mut e);
    let (got, _, cached) = collect(&mut rx);
    assert_eq!(cached, 40, "all 10 complete pages of the shared prompt");
    assert_eq!(metrics.prefix_hit_tokens(), 40);
    assert_eq!(got, want);
}

#[test]
fn cancelled_requests_free_their_pages_within_a_step() {
    let m = model();
    let (mut e, metrics) = engine(&m, 256, 4);
    let (tx, rx) = unbounded_channel();
    e.submit(spec(&prompt(5, 30), 200), tx);
    for _ in 0..5 {
        e.step();
    }
    assert!(metrics.pool().used > metrics.pool().cached);
    drop(rx);
    e.step();
    assert!(e.is_idle());
    let pool = metrics.pool();
    assert_eq!(pool.used, pool.cached);
    assert_eq!(metrics.outcome("cancelled"), 1);
}

#[test]
fn requests_run_different_flows_side_by_side() {
    let m = model();
    let settings = Settings {
        budget: Some(2),
        ..Settings::default()
    };
    let choice = |name: &str| FlowChoice {
        name: name.into(),
        flow: vortex_flow::library::load(name, geometry(&m)).unwrap(),
    };
    let (mut e, _) = engine(&m, 256, 4);
    let mut rxs = Vec::new();
    for name in ["block_topk", "quest", "dense", "h2o"] {
        let mut s = spec(&prompt(8, 30), 8);
        s.flow = Some(choice(name));
        s.settings = settings.clone();
        let (tx, rx) = unbounded_channel();
        e.submit(s, tx);
        rxs.push((name, rx));
    }
    run_all(&mut e);
    for (name, mut rx) in rxs {
        let mut flow = String::new();
        while let Ok(ev) = rx.try_recv() {
            if let Event::Finished { flow: f, .. } = ev {
                flow = f;
            }
        }
        assert_eq!(flow, name);
    }
}

#[test]
fn stop_strings_and_eos_end_generation() {
    let m = model();
    let mut s = spec(&prompt(9, 12), 40);
    let free = run_alone(&m, s.clone());
    let text = m.tokenizer.decode(&free);
    // Stop at the text of the 6th token onwards: the output is the first 5 tokens' text.
    let stop = m.tokenizer.decode(&free[5..7]);
    s.stop = vec![stop.clone()];
    let (mut e, _) = engine(&m, 256, 1);
    let (tx, mut rx) = unbounded_channel();
    e.submit(s, tx);
    run_all(&mut e);
    let mut out = String::new();
    let mut reason = None;
    while let Ok(ev) = rx.try_recv() {
        match ev {
            Event::Delta { text, .. } => out.push_str(&text),
            Event::Finished { reason: r, .. } => reason = Some(r),
            Event::Failed(e) | Event::Refused(e) => panic!("{e}"),
        }
    }
    assert_eq!(reason, Some(FinishReason::Stop));
    assert_eq!(out, &text[..text.find(&stop).unwrap()]);
}

#[test]
fn a_request_larger_than_the_pool_is_refused_with_a_message() {
    let m = model();
    let (mut e, _) = engine(&m, 8, 1);
    let (tx, mut rx) = unbounded_channel();
    e.submit(spec(&prompt(1, 30), 30), tx);
    match rx.try_recv() {
        Ok(Event::Refused(msg)) => assert!(msg.contains("pool holds 8"), "{msg}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Requests the engine could never run are refused at once with a message, whoever calls it.
#[test]
fn requests_that_cannot_run_are_refused_at_submit() {
    let m = model();
    let (mut e, _) = engine(&m, 256, 1);
    let vocab = m.model.config.vocab as u32;
    for (s, want) in [
        (spec(&[], 4), "empty"),
        (spec(&[1, vocab], 4), "outside the vocabulary"),
        (spec(&prompt(1, 5), usize::MAX), "context"),
    ] {
        let (tx, mut rx) = unbounded_channel();
        e.submit(s, tx);
        match rx.try_recv() {
            Ok(Event::Refused(msg)) => assert!(msg.contains(want), "{msg}"),
            other => panic!("expected a refusal with {want:?}, got {other:?}"),
        }
    }
    assert!(e.is_idle());
}

fn sparse(m: &Arc<LoadedModel>, name: &str, p: &[u32], max_tokens: usize) -> RequestSpec {
    let mut s = spec(p, max_tokens);
    s.flow = Some(FlowChoice {
        name: name.into(),
        flow: vortex_flow::library::load(name, geometry(m)).unwrap(),
    });
    s.settings = Settings {
        budget: Some(2),
        ..Settings::default()
    };
    s
}

/// With a sparse flow, a request's output does not depend on the prefix cache: a prompt one
/// token past whole cached pages still computes its last token in the prefill.
#[test]
fn sparse_outputs_do_not_depend_on_prefix_hits() {
    let m = model();
    for name in ["quest", "h2o"] {
        for len in [80, 81, 82] {
            let s = sparse(&m, name, &prompt(55, len), 6);
            let (mut e, metrics) = engine(&m, 256, 1);
            let mut outs = Vec::new();
            for _ in 0..2 {
                let (tx, mut rx) = unbounded_channel();
                e.submit(s.clone(), tx);
                run_all(&mut e);
                outs.push(collect(&mut rx).0);
            }
            assert!(metrics.prefix_hit_tokens() > 0, "{name} {len}: no hit");
            assert_eq!(
                outs[0], outs[1],
                "{name}, {len} tokens: cold and warm differ"
            );
        }
    }
}

/// With a sparse flow, a preempted request recomputes its generated tokens one at a time
/// through the flow's decode, as they were first computed, and finishes as it would alone.
#[test]
fn sparse_outputs_do_not_depend_on_preemption() {
    let m = model();
    let specs: Vec<RequestSpec> = (0..4)
        .map(|i| sparse(&m, "quest", &prompt(10 + i, 20), 24))
        .collect();
    preemption_keeps_outputs(&m, &specs);
}

/// Admission counts the pages running requests still need for their prompts, so requests
/// that cannot run together are not admitted together only to be preempted.
#[test]
fn admission_does_not_overcommit_the_pool() {
    let m = model();
    // 4 prompts of 60 tokens need 16 pages each; 24 pages hold one at a time.
    let (mut e, metrics) = engine(&m, 24, 4);
    let mut rxs = Vec::new();
    for i in 0..4 {
        let (tx, rx) = unbounded_channel();
        e.submit(spec(&prompt(40 + i, 60), 8), tx);
        rxs.push(rx);
    }
    run_all(&mut e);
    for rx in &mut rxs {
        assert_eq!(collect(rx).1, FinishReason::Length);
    }
    assert_eq!(metrics.preemptions(), 0);
}

/// A device that fails for good after `ok` passes.
struct FailingPass {
    ok: usize,
}

impl vortex_model::model::ForwardPass for FailingPass {
    fn forward(
        &mut self,
        model: &vortex_model::model::Model,
        kv: &mut KvState,
        batch: &mut [vortex_model::model::SeqStep],
        wants: &[vortex_model::model::Wants],
    ) -> Result<Vec<vortex_model::model::Next>, vortex_model::model::ForwardError> {
        if self.ok == 0 {
            return Err(vortex_model::model::ForwardError::DeviceLost(
                "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
            ));
        }
        self.ok -= 1;
        vortex_model::model::CpuPass.forward(model, kv, batch, wants)
    }
}

/// When the device is lost, every request fails at once (running or waiting), later ones fail
/// at submit, and the engine's loop ends so that the server reports it.
#[test]
fn a_lost_device_fails_every_request_and_stops_the_engine() {
    let m = model();
    let c = &m.model.config;
    let geom = KvGeometry::new(c.heads_kv, c.head_dim, PAGE).unwrap();
    let cache = KvCache::new(geom, KvDtype::F32, c.layers, 256);
    let flow = vortex_flow::library::load("dense", geometry(&m)).unwrap();
    let cfg = EngineConfig {
        max_running: 2,
        budget: StepBudget {
            max_batch_tokens: 64,
            prefill_chunk: 16,
        },
        prefix_caching: true,
        default_flow: "dense".into(),
        decode_ahead: true,
    };
    let metrics = Arc::new(Metrics::default());
    let mut e = Engine::with_pass(
        m.clone(),
        Box::new(FailingPass { ok: 3 }),
        KvState::new(cache, FlowRunner::new(flow)),
        cfg,
        metrics.clone(),
    );
    let mut rxs = Vec::new();
    for i in 0..4 {
        let (tx, rx) = unbounded_channel();
        e.submit(spec(&prompt(i, 10), 20), tx);
        rxs.push(rx);
    }
    for _ in 0..10 {
        e.step();
    }
    assert!(e.lost().is_some());
    assert!(e.is_idle(), "nothing is left waiting on a lost device");
    for rx in &mut rxs {
        let mut failed = false;
        while let Ok(ev) = rx.try_recv() {
            failed |= matches!(ev, Event::Failed(_));
        }
        assert!(failed);
    }
    assert_eq!(metrics.pool().leaked, 0);
    let (tx, mut rx) = unbounded_channel();
    e.submit(spec(&prompt(9, 5), 2), tx);
    assert!(matches!(rx.try_recv(), Ok(Event::Failed(m)) if m.contains("stopped")));

    let handle = vortex_engine::EngineHandle::spawn(e, metrics);
    for _ in 0..100 {
        if !handle.is_running() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("the engine's loop still runs");
}

/// A device that keeps its own flows, as a GPU does: it records the flows the engine asks it to
/// load, and cannot load `h2o`.
struct OwnFlowsPass(Arc<std::sync::Mutex<Vec<String>>>);

impl vortex_model::model::ForwardPass for OwnFlowsPass {
    fn forward(
        &mut self,
        model: &vortex_model::model::Model,
        kv: &mut KvState,
        batch: &mut [vortex_model::model::SeqStep],
        wants: &[vortex_model::model::Wants],
    ) -> Result<Vec<vortex_model::model::Next>, vortex_model::model::ForwardError> {
        vortex_model::model::CpuPass.forward(model, kv, batch, wants)
    }

    fn load_flow(
        &mut self,
        flow: &vortex_flow::Flow,
        _seqs: &[&vortex_kv::Sequence],
    ) -> Result<(), String> {
        self.0.lock().unwrap().push(flow.name.clone());
        if flow.name == "h2o" {
            return Err("no memory for h2o".into());
        }
        Ok(())
    }
}

/// On such a device a request may choose another flow (loaded on the device once, at start or
/// when first chosen) and set its own budget and dense layers. A flow the device cannot load
/// fails only the requests that chose it, after one attempt.
#[test]
fn a_device_with_flows_of_its_own_loads_each_once() {
    let m = model();
    let c = &m.model.config;
    let geom = KvGeometry::new(c.heads_kv, c.head_dim, PAGE).unwrap();
    let cache = KvCache::new(geom, KvDtype::F32, c.layers, 256);
    let flow = vortex_flow::library::load("quest", geometry(&m)).unwrap();
    let mut cfg_flow = flow.settings.clone();
    let kv = KvState::new(cache, FlowRunner::new(flow));
    let cfg = EngineConfig {
        max_running: 2,
        budget: StepBudget {
            max_batch_tokens: 64,
            prefill_chunk: 16,
        },
        prefix_caching: true,
        default_flow: "quest".into(),
        decode_ahead: true,
    };
    let loaded = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut e = Engine::with_pass(
        m.clone(),
        Box::new(OwnFlowsPass(loaded.clone())),
        kv,
        cfg,
        Arc::new(Metrics::default()),
    );
    let choice = |name: &str| FlowChoice {
        name: name.into(),
        flow: vortex_flow::library::load(name, geometry(&m)).unwrap(),
    };
    e.load_flows(&[choice("block_topk")]).unwrap();
    let mut s = spec(&prompt(3, 20), 4);
    cfg_flow.budget = Some(3);
    s.settings = cfg_flow.clone();
    let mut runs = Vec::new();
    for flow in [
        None,
        Some("block_topk"),
        Some("lsh"),
        Some("lsh"),
        Some("h2o"),
        Some("h2o"),
    ] {
        let mut s = s.clone();
        if let Some(name) = flow {
            s.flow = Some(choice(name));
            s.settings = choice(name).flow.settings;
        }
        let (tx, rx) = unbounded_channel();
        e.submit(s, tx);
        runs.push(rx);
    }
    run_all(&mut e);
    for rx in &mut runs[..4] {
        assert_eq!(collect(rx).1, FinishReason::Length);
    }
    for rx in &mut runs[4..] {
        assert!(matches!(rx.try_recv(), Ok(Event::Refused(m)) if m.contains("no memory for h2o")));
    }
    // One attempt at h2o: the second request for it fails without another.
    assert_eq!(*loaded.lock().unwrap(), ["block_topk", "lsh", "h2o"]);
    s.settings.dense_layers = vec![0];
    s.settings.tolerance = 0.1;
    let (tx, mut rx) = unbounded_channel();
    e.submit(s, tx);
    run_all(&mut e);
    assert_eq!(collect(&mut rx).1, FinishReason::Length);
    assert_eq!(loaded.lock().unwrap().len(), 3);
}

/// Two requests that compute the same prompt page in one step: the second holds the cached
/// copy instead of its own, so that every cached page stays evictable once no request needs it
/// and a request that fits the pool alone always runs.
#[test]
fn the_same_page_computed_twice_is_held_once() {
    let m = model();
    let shared = prompt(21, 4);
    let mut a = shared.clone();
    a.extend([7, 8]);
    let mut b = shared.clone();
    b.extend(prompt(22, 8));
    // b alone needs exactly the 6 pages of the pool (12 prompt tokens and 12 generated).
    let (mut e, metrics) = engine(&m, 6, 2);
    let (ta, mut ra) = unbounded_channel();
    let (tb, mut rb) = unbounded_channel();
    e.submit(spec(&a, 1), ta);
    e.submit(spec(&b, 12), tb);
    run_all(&mut e);
    assert_eq!(collect(&mut ra).1, FinishReason::Length);
    assert_eq!(collect(&mut rb).1, FinishReason::Length);
    let pool = metrics.pool();
    assert_eq!(pool.leaked, 0);
    assert_eq!(pool.used, pool.cached);
}

/// A device pass that gives only what was asked: greedy rows their argmax, prompt chunks
/// before the last nothing, sampling rows their logits. `skip` also drops the token of every
/// row, to show that a pass that gives none fails the request instead of stalling it.
struct AskedPass {
    asked: Arc<std::sync::Mutex<Vec<vortex_model::model::Wants>>>,
    skip: bool,
}

impl vortex_model::model::ForwardPass for AskedPass {
    fn forward(
        &mut self,
        model: &vortex_model::model::Model,
        kv: &mut KvState,
        batch: &mut [vortex_model::model::SeqStep],
        wants: &[vortex_model::model::Wants],
    ) -> Result<Vec<vortex_model::model::Next>, vortex_model::model::ForwardError> {
        use vortex_model::model::{CpuPass, Next, Wants};
        self.asked.lock().unwrap().extend_from_slice(wants);
        let next = CpuPass.forward(model, kv, batch, wants)?;
        Ok(next
            .into_iter()
            .zip(wants)
            .map(|(n, w)| match (n, w) {
                _ if self.skip => Next::Nothing,
                (Next::Logits(l), Wants::Argmax) => Next::Token(vortex_model::sampling::argmax(&l)),
                (_, Wants::Nothing) => Next::Nothing,
                (n, _) => n,
            })
            .collect())
    }
}

fn asked_engine(
    m: &Arc<LoadedModel>,
    skip: bool,
    asked: &Arc<std::sync::Mutex<Vec<vortex_model::model::Wants>>>,
) -> Engine {
    let c = &m.model.config;
    let geom = KvGeometry::new(c.heads_kv, c.head_dim, PAGE).unwrap();
    let cache = KvCache::new(geom, KvDtype::F32, c.layers, 256);
    let flow = vortex_flow::library::load("dense", geometry(m)).unwrap();
    let cfg = EngineConfig {
        max_running: 8,
        budget: StepBudget {
            max_batch_tokens: 64,
            prefill_chunk: 8,
        },
        prefix_caching: true,
        default_flow: "dense".into(),
        decode_ahead: true,
    };
    Engine::with_pass(
        m.clone(),
        Box::new(AskedPass {
            asked: asked.clone(),
            skip,
        }),
        KvState::new(cache, FlowRunner::new(flow)),
        cfg,
        Arc::new(Metrics::default()),
    )
}

/// Greedy requests take the argmax a pass chose for them; sampling at a temperature with nothing
/// that changes the logits asks for a draw, its cuts included; other sampling (and
/// log-probabilities) gets logits; prompt chunks before the last ask for nothing. Outputs are
/// those of the engine on the CPU pass.
#[test]
fn a_pass_gives_greedy_rows_their_argmax_and_the_outputs_hold() {
    let m = model();
    let mut specs: Vec<RequestSpec> = (0..5).map(|i| spec(&prompt(i, 20), 10)).collect();
    specs[1].sampling = SamplingParams {
        temperature: 0.8,
        top_p: 0.9,
        seed: 5,
        ..Default::default()
    };
    specs[2].logprobs = Some(2);
    specs[3].sampling.repetition_penalty = 1.3;
    // Sampling at a temperature: a device may draw it (this pass gives logits instead).
    specs[4].sampling = SamplingParams {
        temperature: 1.0,
        seed: 6,
        ..Default::default()
    };
    let run = |mut e: Engine| {
        let mut rxs = submit_all(&mut e, &specs);
        run_all(&mut e);
        rxs.iter_mut().map(|rx| collect(rx).0).collect::<Vec<_>>()
    };
    let (cpu, _) = engine(&m, 256, 8);
    let want = run(cpu);
    let asked = Arc::default();
    assert_eq!(run(asked_engine(&m, false, &asked)), want);
    let asked = asked.lock().unwrap();
    for w in [Wants::Argmax, Wants::Logits, Wants::Nothing] {
        assert!(asked.contains(&w), "{w:?} never asked");
    }
    for (t, top_p) in [(1.0, 1.0), (0.8, 0.9)] {
        assert!(
            asked
                .iter()
                .any(|w| matches!(w, Wants::Draw(d) if d.temperature == t && d.top_p == top_p)),
            "no draw at temperature {t}, top-p {top_p} asked"
        );
    }
}

/// A request for its prompt alone asks no pass for a token, even when its prompt is a single
/// token (a decode-sized step), and the requests batched beside it generate as they would alone.
#[test]
fn the_prompt_alone_asks_for_nothing() {
    let m = model();
    let specs = [
        spec(&prompt(1, 8), 0),
        spec(&[42], 0),
        spec(&prompt(2, 12), 6),
    ];
    let want = run_alone(&m, specs[2].clone());
    let asked = Arc::default();
    let mut e = asked_engine(&m, false, &asked);
    let mut rxs = submit_all(&mut e, &specs[..2]);
    e.step();
    assert!(e.is_idle(), "both finished in the step of their prefill");
    assert!(asked.lock().unwrap().iter().all(|w| *w == Wants::Nothing));
    rxs.extend(submit_all(&mut e, &specs));
    run_all(&mut e);
    let out: Vec<_> = rxs.iter_mut().map(collect).collect();
    for (tokens, reason, _) in &out[..4] {
        assert!(tokens.is_empty());
        assert_eq!(*reason, FinishReason::Length);
    }
    assert_eq!(out[4].0, want);
}

#[test]
fn a_pass_that_gives_no_token_fails_the_request() {
    let m = model();
    let mut e = asked_engine(&m, true, &Arc::default());
    let (tx, mut rx) = unbounded_channel();
    e.submit(spec(&prompt(1, 12), 4), tx);
    run_all(&mut e);
    let mut failed = None;
    while let Ok(ev) = rx.try_recv() {
        if let Event::Failed(why) = ev {
            failed = Some(why);
        }
    }
    assert!(
        failed.is_some_and(|w| w.contains("Nothing")),
        "the request must fail, not stall"
    );
}

/// A pass that loses a row's result.
struct ShortPass;

impl vortex_model::model::ForwardPass for ShortPass {
    fn forward(
        &mut self,
        model: &vortex_model::model::Model,
        kv: &mut KvState,
        batch: &mut [vortex_model::model::SeqStep],
        wants: &[Wants],
    ) -> Result<Vec<vortex_model::model::Next>, vortex_model::model::ForwardError> {
        let mut next = vortex_model::model::CpuPass.forward(model, kv, batch, wants)?;
        next.pop();
        Ok(next)
    }
}

/// Results that do not match the batch fail its requests (none stalls).
#[test]
fn a_pass_that_gives_too_few_results_fails_its_requests() {
    let m = model();
    let c = &m.model.config;
    let geom = KvGeometry::new(c.heads_kv, c.head_dim, PAGE).unwrap();
    let cache = KvCache::new(geom, KvDtype::F32, c.layers, 256);
    let flow = vortex_flow::library::load("dense", geometry(&m)).unwrap();
    let (_, metrics) = engine(&m, 8, 1);
    let cfg = EngineConfig {
        max_running: 4,
        budget: StepBudget {
            max_batch_tokens: 64,
            prefill_chunk: 16,
        },
        prefix_caching: false,
        default_flow: "dense".into(),
        decode_ahead: true,
    };
    let mut e = Engine::with_pass(
        m.clone(),
        Box::new(ShortPass),
        KvState::new(cache, FlowRunner::new(flow)),
        cfg,
        metrics,
    );
    let mut rxs = Vec::new();
    for i in 0..2 {
        let (tx, rx) = unbounded_channel();
        e.submit(spec(&prompt(i, 6), 3), tx);
        rxs.push(rx);
    }
    run_all(&mut e);
    for rx in &mut rxs {
        let mut failed = None;
        while let Ok(ev) = rx.try_recv() {
            if let Event::Failed(why) = ev {
                failed = Some(why);
            }
        }
        assert!(failed.is_some_and(|w| w.contains("results for")));
    }
}

/// A 3-token prompt cannot run beside one decode in a 3-token step (a chunk of 2 would leave a
/// single prompt token): later prompts must not take the room it waits for, or a steady stream
/// of them holds it back for ever.
#[test]
fn a_waiting_prompt_is_not_overtaken_by_later_ones() {
    let m = model();
    let c = &m.model.config;
    let geom = KvGeometry::new(c.heads_kv, c.head_dim, PAGE).unwrap();
    let cache = KvCache::new(geom, KvDtype::F32, c.layers, 256);
    let flow = vortex_flow::library::load("dense", geometry(&m)).unwrap();
    let kv = KvState::new(cache, FlowRunner::new(flow));
    let cfg = EngineConfig {
        max_running: 3,
        budget: StepBudget {
            max_batch_tokens: 3,
            prefill_chunk: 16,
        },
        prefix_caching: true,
        default_flow: "dense".into(),
        decode_ahead: false,
    };
    let mut e = Engine::with_pass(m.clone(), Box::new(CpuPass), kv, cfg, Arc::default());
    let (t0, _r0) = unbounded_channel();
    e.submit(spec(&prompt(1, 2), 6), t0);
    e.step();
    let (tp, mut rp) = unbounded_channel();
    e.submit(spec(&prompt(2, 3), 1), tp);
    let mut later = Vec::new();
    let mut answered = false;
    for step in 0..200 {
        if step % 3 == 0 {
            let (t, r) = unbounded_channel();
            e.submit(spec(&prompt(100 + step, 2), 4), t);
            later.push(r);
        }
        e.step();
        while let Ok(ev) = rp.try_recv() {
            answered |= matches!(ev, Event::Finished { .. });
        }
        if answered {
            break;
        }
    }
    assert!(answered, "the 3-token prompt waited 200 steps");
}

/// Tokens a request streamed count once it ends, however it ends: here preempted, then
/// cancelled while it waits.
#[test]
fn tokens_of_a_request_cancelled_while_waiting_are_counted() {
    let m = model();
    let (mut e, metrics) = engine(&m, 20, 4);
    let mut rxs = Vec::new();
    for i in 0..4 {
        let (tx, rx) = unbounded_channel();
        e.submit(spec(&prompt(10 + i, 20), 24), tx);
        rxs.push(rx);
    }
    let mut streamed = 0usize;
    for _ in 0..1000 {
        e.step();
        for rx in &mut rxs {
            while let Ok(ev) = rx.try_recv() {
                if let Event::Delta { tokens, .. } = ev {
                    streamed += tokens.len();
                }
            }
        }
        if metrics.preemptions() > 0 && metrics.pool().waiting > 0 {
            break;
        }
    }
    assert!(metrics.pool().waiting > 0, "no request was left waiting");
    rxs.clear();
    e.step();
    assert!(e.is_idle());
    assert_eq!(metrics.generation_tokens(), streamed as u64);
}
