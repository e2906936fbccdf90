//! `#[ignore]`d: the serving engine's decode rate on the GPU, host work included (sampling,
//! logits copies, streaming), for greedy and sampled requests. 16 requests of 2048 random
//! prompt tokens each generate 128 tokens with a random model of Qwen3-0.6B's shape (vocabulary
//! 151,936). Times the steps after every request has its first token, reading each step's
//! tokens first and decoding ahead of the host. Skips visibly without a GPU.

mod common;

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use vortex_cuda::PoolDtype;
use vortex_cuda::model::{CudaPass, GpuModel, PoolSpec, WeightSource};
use vortex_engine::{Engine, EngineConfig, Event, Metrics, RequestSpec, StepBudget};
use vortex_flow::Geometry;
use vortex_flow::runner::FlowRunner;
use vortex_kv::{KvCache, KvDtype, KvGeometry};
use vortex_model::model::KvState;
use vortex_model::sampling::SamplingParams;

const PAGE: usize = 16;
const REQUESTS: usize = 16;
const PROMPT: usize = 2048;
const NEW: usize = 128;

#[test]
#[ignore]
fn gpu_engine_speed() {
    let Some(dev) = common::device_or_skip("gpu_engine_speed") else {
        return;
    };
    let config = vortex_model::random::geometry("qwen3-0.6b").unwrap();
    let mut m = vortex_model::random::tiny(3);
    m.model = vortex_model::random::random_weights(config.clone(), 3);
    let m = Arc::new(m);
    let c = &m.model.config;
    let g = Geometry {
        heads_q: c.heads_q,
        heads_kv: c.heads_kv,
        head_dim: c.head_dim,
        page_size: PAGE,
    };
    let pages = REQUESTS * (PROMPT + NEW).div_ceil(PAGE) + 64;
    println!("{}", dev.describe());
    println!("| flow | decode ahead | sampling | decode steps | ms a step | tokens/s |");
    println!("|---|---|---|---|---|---|");
    let mut dev = Some(dev);
    let runs = ["dense", "block_topk"]
        .into_iter()
        .flat_map(|name| [(name, false), (name, true)]);
    for (name, ahead) in runs {
        let flow = vortex_flow::library::load(name, g).unwrap();
        let pool = PoolSpec {
            page_size: PAGE,
            num_pages: pages,
            dtype: PoolDtype::Bf16,
        };
        let gpu = GpuModel::new(
            dev.take().expect("one model at a time"),
            c.clone(),
            WeightSource::Model(&m.model),
            pool,
            &flow,
        )
        .unwrap();
        let geom = KvGeometry::new(c.heads_kv, c.head_dim, PAGE).unwrap();
        let kv = KvState::new(
            KvCache::new(geom, KvDtype::Bf16, 0, pages),
            FlowRunner::new(flow),
        );
        let cfg = EngineConfig {
            max_running: REQUESTS,
            budget: StepBudget {
                max_batch_tokens: 4096,
                prefill_chunk: 1024,
            },
            prefix_caching: false,
            default_flow: name.into(),
            decode_ahead: ahead,
        };
        let mut e = Engine::with_pass(
            m.clone(),
            Box::new(CudaPass::new(gpu)),
            kv,
            cfg,
            Arc::new(Metrics::default()),
        );
        // An untimed round first: the first steps of each batch shape capture their graphs,
        // which would count against whichever sampling ran first.
        decode_rate(&mut e, &SamplingParams::default(), c.vocab);
        for (label, sampling) in [
            ("greedy", SamplingParams::default()),
            (
                "temperature 1",
                SamplingParams {
                    temperature: 1.0,
                    seed: 1,
                    ..Default::default()
                },
            ),
            (
                "temperature 0.7, top-p 0.9",
                SamplingParams {
                    temperature: 0.7,
                    top_p: 0.9,
                    seed: 1,
                    ..Default::default()
                },
            ),
        ] {
            let (steps, secs, tokens) = decode_rate(&mut e, &sampling, c.vocab);
            let ahead = if ahead { "yes" } else { "no" };
            println!(
                "| {name} | {ahead} | {label} | {steps} | {:.3} | {:.0} |",
                secs * 1e3 / steps as f64,
                tokens as f64 / secs
            );
        }
        drop(e);
        dev = Some(vortex_cuda::Device::open(0).unwrap());
    }
}

/// Decode steps, seconds and tokens from the step after which every request has a token until
/// the last finishes.
fn decode_rate(e: &mut Engine, sampling: &SamplingParams, vocab: usize) -> (usize, f64, usize) {
    let mut rxs: Vec<UnboundedReceiver<Event>> = Vec::new();
    let mut x = 0x9e37_79b9u64 ^ sampling.seed ^ (sampling.temperature.to_bits() as u64) << 20;
    for _ in 0..REQUESTS {
        let prompt = (0..PROMPT)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % vocab as u64) as u32
            })
            .collect();
        let (tx, rx) = unbounded_channel();
        e.submit(
            RequestSpec {
                prompt,
                sampling: sampling.clone(),
                max_tokens: NEW,
                stop: vec![],
                stop_tokens: vec![],
                keep_stop: false,
                min_tokens: 0,
                skip_special: true,
                ignore_eos: true,
                flow: None,
                settings: Default::default(),
                logprobs: None,
                prompt_logprobs: None,
                grammar: None,
            },
            tx,
        );
        rxs.push(rx);
    }
    let mut got = vec![0usize; REQUESTS];
    let mut drain = |got: &mut [usize]| {
        for (n, rx) in got.iter_mut().zip(&mut rxs) {
            while let Ok(ev) = rx.try_recv() {
                match ev {
                    Event::Delta { tokens, .. } => *n += tokens.len(),
                    Event::Failed(why) => panic!("request failed: {why}"),
                    _ => {}
                }
            }
        }
    };
    while got.contains(&0) {
        e.step();
        drain(&mut got);
    }
    let (start, before) = (Instant::now(), got.iter().sum::<usize>());
    let mut steps = 0;
    while !e.is_idle() {
        e.step();
        drain(&mut got);
        steps += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    assert!(got.iter().all(|&n| n == NEW));
    (steps, secs, got.iter().sum::<usize>() - before)
}
