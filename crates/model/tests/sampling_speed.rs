//! `#[ignore]`d timing of the sampler over a 151,936-token vocabulary (Qwen's), logits drawn
//! like a model's (normal, a few tokens far ahead), for each kind of sampling a request can ask
//! for, and nearly flat (a random model's, or a high temperature's) for top-p: `cargo test --release -p vortex-model --test sampling_speed -- --ignored --nocapture`.

use std::time::Instant;

use vortex_model::sampling::{Sampler, SamplingParams};

#[test]
#[ignore]
fn sampling_speed() {
    let vocab = 151_936;
    let mut x = 1u64;
    let mut uniform = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ((x >> 40) as f64 + 0.5) / (1u64 << 24) as f64
    };
    let mut logits: Vec<f32> = (0..vocab)
        .map(|_| {
            let (u, v) = (uniform(), uniform());
            (2.5 * (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
        })
        .collect();
    for (i, l) in [(17, 16.0), (900, 15.0), (4000, 14.5), (77_000, 13.0)] {
        logits[i] = l;
    }
    let prompt: Vec<u32> = (0..32_768u32).map(|i| i * 4 % vocab as u32).collect();
    let flat: Vec<f32> = logits.iter().map(|l| l * 0.02).collect();
    let kinds = [
        ("greedy", 0.0, 0, 1.0, 1.0),
        ("nearly flat logits, top_p 0.9", 1.0, 0, 0.9, 1.0),
        ("tied flat logits, top_p 0.5", 1.0, 0, 0.5, 1.0),
        ("temperature 1", 1.0, 0, 1.0, 1.0),
        ("temperature 0.7, top_p 0.9", 0.7, 0, 0.9, 1.0),
        ("temperature 0.7, top_k 50", 0.7, 50, 1.0, 1.0),
        (
            "temperature 1, repetition penalty 1.1 (32K prompt)",
            1.0,
            0,
            1.0,
            1.1,
        ),
    ];
    let mut buf = logits.clone();
    let iters = 200;
    for (name, temperature, top_k, top_p, repetition_penalty) in kinds {
        let tied = vec![0.0f32; 20_000];
        let logits = if name.starts_with("tied") {
            &tied
        } else if name.starts_with("nearly flat") {
            &flat
        } else {
            &logits
        };
        let mut s = Sampler::new(
            SamplingParams {
                temperature,
                top_k,
                top_p,
                repetition_penalty,
                seed: 1,
                ..Default::default()
            },
            &prompt,
        );
        let t = Instant::now();
        for _ in 0..iters {
            buf.resize(logits.len(), 0.0);
            buf.copy_from_slice(logits);
            std::hint::black_box(s.sample(&mut buf));
        }
        let ms = t.elapsed().as_secs_f64() * 1e3 / iters as f64;
        println!("{name}: {ms:.3} ms a row");
    }
}
