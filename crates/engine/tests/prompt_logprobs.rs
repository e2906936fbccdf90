//! Prompt log-probabilities (`prompt_logprobs`): each prompt token's, the second on, as the
//! model gives it after the tokens before, across prefill chunks, with the prefix cache and
//! through preemption, and for a request that generates nothing.

mod common;

use common::*;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use vortex_engine::{Engine, Event, FinishReason, RequestSpec, TokenLogprob};
use vortex_model::model::CpuPass;

/// The prompt scores and generated tokens of a finished request.
fn collect_scored(rx: &mut UnboundedReceiver<Event>) -> (Vec<TokenLogprob>, Vec<u32>) {
    let (mut scores, mut tokens) = (Vec::new(), Vec::new());
    while let Ok(ev) = rx.try_recv() {
        match ev {
            Event::Delta {
                tokens: t, prompt, ..
            } => {
                assert!(
                    prompt.is_empty() || tokens.is_empty(),
                    "scores before tokens"
                );
                scores.extend(prompt);
                tokens.extend(t);
            }
            Event::Finished { .. } => return (scores, tokens),
            Event::Failed(e) | Event::Refused(e) => panic!("{e}"),
        }
    }
    panic!("the request did not finish");
}

fn run(e: &mut Engine, specs: &[RequestSpec]) -> Vec<(Vec<TokenLogprob>, Vec<u32>)> {
    let mut rxs = Vec::new();
    for s in specs {
        let (tx, rx) = unbounded_channel();
        e.submit(s.clone(), tx);
        rxs.push(rx);
    }
    run_all(e);
    rxs.iter_mut().map(collect_scored).collect()
}

/// Each prompt token's log-probability, and every token's, as the first generated token of
/// the prompt before it reports them (the whole vocabulary listed).
fn reference(p: &[u32]) -> Vec<Vec<(u32, f32)>> {
    let m = model();
    let vocab = m.model.config.vocab;
    (1..p.len())
        .map(|t| {
            let (mut e, _) = engine_on(&m, Box::new(CpuPass), 64, 1, false);
            let mut s = spec(&p[..t], 1);
            s.logprobs = Some(vocab);
            let (tx, mut rx) = unbounded_channel();
            e.submit(s, tx);
            run_all(&mut e);
            let mut top = Vec::new();
            while let Ok(ev) = rx.try_recv() {
                if let Event::Delta { logprobs, .. } = ev {
                    top.extend(logprobs.into_iter().flat_map(|l| l.top));
                }
            }
            assert_eq!(top.len(), vocab);
            top
        })
        .collect()
}

fn check(scores: &[TokenLogprob], p: &[u32], want: &[Vec<(u32, f32)>], k: usize) {
    assert_eq!(scores.len(), p.len() - 1);
    for (t, (s, all)) in scores.iter().zip(want).enumerate() {
        assert_eq!(s.token, p[t + 1]);
        let exact = all.iter().find(|x| x.0 == s.token).unwrap().1;
        assert!(
            (s.logprob - exact).abs() < 1e-3,
            "token {t}: {} {exact}",
            s.logprob
        );
        assert_eq!(s.top.len(), k);
        for (got, w) in s.top.iter().zip(all) {
            assert!((got.1 - w.1).abs() < 1e-3, "token {t}: {got:?} {w:?}");
        }
    }
}

#[test]
fn prompt_scores_match_each_prefix_alone_across_chunks() {
    let m = model();
    // 40 tokens: three prefill chunks of at most 16.
    let p = prompt(3, 40);
    let want = reference(&p);
    let (mut e, _) = engine_on(&m, Box::new(CpuPass), 64, 2, false);
    let mut s = spec(&p, 4);
    s.prompt_logprobs = Some(3);
    let plain = spec(&p, 4);
    let out = run(&mut e, &[s.clone(), plain]);
    check(&out[0].0, &p, &want, 3);
    assert!(out[1].0.is_empty(), "asked for none");
    assert_eq!(out[0].1, out[1].1, "scoring leaves the tokens as they were");
    // Its pages are now cached: a second run computes the prompt again all the same.
    let again = run(&mut e, &[s]);
    check(&again[0].0, &p, &want, 3);
}

#[test]
fn prompt_scores_are_sent_once_through_preemption() {
    let m = model();
    let specs: Vec<RequestSpec> = (0..4)
        .map(|i| {
            let mut s = spec(&prompt(10 + i, 20), 24);
            s.prompt_logprobs = Some(0);
            s
        })
        .collect();
    let alone: Vec<_> = specs
        .iter()
        .map(|s| {
            run(
                &mut engine_on(&m, Box::new(CpuPass), 64, 1, false).0,
                std::slice::from_ref(s),
            )
        })
        .collect();
    // 20 pages of 4 tokens for 4 requests of up to 44: some are preempted and recomputed.
    let (mut e, metrics) = engine_on(&m, Box::new(CpuPass), 20, 4, false);
    let out = run(&mut e, &specs);
    assert!(metrics.preemptions() > 0, "the pool was meant to run out");
    for (got, want) in out.iter().zip(&alone) {
        assert_eq!(got.0.len(), 19);
        assert_eq!(got, &want[0]);
    }
}

/// A request of `max_tokens` 0 asks for its prompt alone: it finishes in the step that computes
/// its prompt's last chunk, with the scores a generating request gets and no token, and gives
/// its pages back. Its prompt may fill the pool, where a token more would not fit.
#[test]
fn the_prompt_alone_finishes_after_its_prefill() {
    let m = model();
    // 40 tokens: three prefill chunks of at most 16, in a pool of 10 pages of 4.
    let p = prompt(5, 40);
    let mut generating = spec(&p, 1);
    generating.prompt_logprobs = Some(2);
    let want = run(
        &mut engine_on(&m, Box::new(CpuPass), 64, 1, false).0,
        std::slice::from_ref(&generating),
    );
    let (mut e, metrics) = engine_on(&m, Box::new(CpuPass), 10, 2, false);
    let (tx, mut rx) = unbounded_channel();
    e.submit(generating.clone(), tx);
    match rx.try_recv() {
        Ok(Event::Refused(msg)) => assert!(msg.contains("pool holds 10"), "{msg}"),
        other => panic!("a token after the prompt cannot fit: {other:?}"),
    }
    let mut alone = generating;
    alone.max_tokens = 0;
    let (tx, mut rx) = unbounded_channel();
    e.submit(alone, tx);
    for _ in 0..3 {
        assert!(e.step());
    }
    assert!(e.is_idle(), "finished with its prefill");
    let mut scores = Vec::new();
    let mut end = None;
    while let Ok(ev) = rx.try_recv() {
        match ev {
            Event::Delta {
                text,
                tokens,
                logprobs,
                prompt,
            } => {
                assert!(text.is_empty() && tokens.is_empty() && logprobs.is_empty());
                scores.extend(prompt);
            }
            Event::Finished { reason, usage, .. } => end = Some((reason, usage)),
            Event::Failed(e) | Event::Refused(e) => panic!("{e}"),
        }
    }
    let (reason, usage) = end.expect("finished");
    assert_eq!(reason, FinishReason::Length);
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (40, 0));
    assert_eq!(scores, want[0].0, "scored as a request that generates");
    assert_eq!(metrics.generation_tokens(), 0);
    assert_eq!(metrics.outcome("length"), 1);
    let pool = metrics.pool();
    assert_eq!(pool.leaked, 0);
    assert_eq!(
        pool.used, pool.cached,
        "only the prefix cache holds its pages"
    );
}
