//! Decoding ahead of the host, on a CPU pass that picks greedy tokens itself: the engine's
//! outputs, finish reasons and pages are those of reading each step's tokens first, whatever
//! ends a request (its length, a stop token, a stop string), arrives, is cancelled or preempted
//! meanwhile.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use vortex_engine::request::token_logprob;
use vortex_engine::{Engine, Event, FinishReason, Metrics, RequestSpec, TokenLogprob};
use vortex_model::grammar::{Grammar, Matcher};
use vortex_model::loader::LoadedModel;
use vortex_model::model::{
    CpuPass, ForwardError, ForwardPass, KvState, Model, Next, SeqStep, Wants,
};
use vortex_model::sampling::{DeviceDraw, SamplingParams};

/// The CPU model as a device that picks tokens where the logits are (greedy, or a draw at a
/// temperature from its seed, under a grammar's mask where asked): a queued pass runs at once,
/// on the tokens the pass before it picked where asked.
#[derive(Default)]
struct AheadCpu {
    logits: Vec<Vec<f32>>,
    picks: Vec<Next>,
    unread: bool,
    /// Which read of the picks fails (1 for the first; 0: none), leaving them unread as a
    /// device error does.
    fail_read: usize,
    reads: usize,
    /// Tokens picked under a mask, and of those, picked ahead.
    masked: Arc<AtomicUsize>,
    masked_ahead: Arc<AtomicUsize>,
    /// Whether it refuses to pick under a mask ahead, as a device without that does.
    no_masks_ahead: bool,
    /// Rows given their log-probabilities with their token.
    scored: Arc<AtomicUsize>,
}

impl ForwardPass for AheadCpu {
    fn forward(
        &mut self,
        model: &Model,
        kv: &mut KvState,
        batch: &mut [SeqStep],
        wants: &[Wants],
    ) -> Result<Vec<Next>, ForwardError> {
        assert!(
            !self.unread,
            "a pass read by the host while tokens are in flight"
        );
        let next = CpuPass.forward(model, kv, batch, wants)?;
        Ok(next
            .into_iter()
            .zip(wants)
            .map(|(n, w)| match (n, w) {
                (Next::Logits(l), Wants::Logits | Wants::Nothing) => Next::Logits(l),
                (Next::Logits(l), w) => self.next(&l, w),
                (n, _) => n,
            })
            .collect())
    }

    fn picks_ahead(&self, wants: &Wants) -> bool {
        match wants {
            Wants::MaskedDraw(..) => !self.no_masks_ahead,
            Wants::Scored(inner, _) => self.picks_ahead(inner),
            w => w.device_pick().is_some(),
        }
    }

    fn masks_ahead(&self) -> bool {
        !self.no_masks_ahead
    }

    fn scores_logprobs(&self) -> bool {
        true
    }

    fn queue_decode(
        &mut self,
        model: &Model,
        kv: &mut KvState,
        batch: &mut [SeqStep],
        picked: bool,
    ) -> Result<(), ForwardError> {
        assert_eq!(picked, self.unread, "picks taken or left wrongly");
        let tokens: Vec<u32> = if picked {
            assert_eq!(
                batch.len(),
                self.picks.len(),
                "another batch than the picks'"
            );
            self.picks
                .iter()
                .map(|p| match p {
                    Next::Token(t) | Next::Scored { token: t, .. } => *t,
                    other => panic!("{other:?} picked"),
                })
                .collect()
        } else {
            batch.iter().map(|s| s.tokens[0]).collect()
        };
        self.unread = false;
        let mut steps: Vec<SeqStep> = batch
            .iter_mut()
            .zip(&tokens)
            .map(|(s, t)| SeqStep {
                seq: &mut *s.seq,
                state: &mut *s.state,
                settings: s.settings,
                tokens: std::slice::from_ref(t),
            })
            .collect();
        self.logits = model.forward(kv, &mut steps)?;
        Ok(())
    }

    fn pick_ahead(&mut self, wants: &[Wants]) -> Result<(), ForwardError> {
        assert_eq!(wants.len(), self.logits.len());
        let masked = wants
            .iter()
            .filter(|w| match w {
                Wants::Scored(inner, _) => matches!(**inner, Wants::MaskedDraw(..)),
                w => matches!(w, Wants::MaskedDraw(..)),
            })
            .count();
        assert!(masked == 0 || !self.no_masks_ahead, "a mask picked ahead");
        self.masked_ahead.fetch_add(masked, Ordering::Relaxed);
        self.picks = self
            .logits
            .iter()
            .zip(wants)
            .map(|(l, w)| self.next(l, w))
            .collect();
        self.unread = true;
        Ok(())
    }

    fn picked(&mut self) -> Result<Vec<Next>, ForwardError> {
        self.reads += 1;
        if self.reads == self.fail_read {
            return Err(ForwardError::Backend("the copy back failed".into()));
        }
        self.unread = false;
        Ok(self.picks.clone())
    }

    fn discard_ahead(&mut self) {
        self.unread = false;
    }
}

impl AheadCpu {
    /// The token `wants` asks for, with its log-probabilities where it asks for them.
    fn next(&self, logits: &[f32], wants: &Wants) -> Next {
        let Wants::Scored(inner, k) = wants else {
            return Next::Token(self.pick(logits, wants));
        };
        self.scored.fetch_add(1, Ordering::Relaxed);
        let token = self.pick(logits, inner);
        let lp = token_logprob(logits, token, *k);
        Next::Scored {
            token,
            logprob: lp.logprob,
            top: lp.top,
        }
    }

    /// [`pick`], under the mask of a masked draw.
    fn pick(&self, logits: &[f32], wants: &Wants) -> u32 {
        let Wants::MaskedDraw(d, allowed) = wants else {
            return pick(logits, wants);
        };
        self.masked.fetch_add(1, Ordering::Relaxed);
        let mut l = logits.to_vec();
        allowed.mask(&mut l);
        let w = match d.temperature {
            0.0 => Wants::Argmax,
            _ => Wants::Draw(*d),
        };
        pick(&l, &w)
    }
}

/// The argmax (the lowest id among equals, as the host's greedy sampler), or the Gumbel-max
/// draw at the temperature (with no cuts) with noise hashed from the seed and the token id.
fn pick(logits: &[f32], wants: &Wants) -> u32 {
    let (inv_t, seed) = match *wants {
        Wants::Argmax => (0.0, 0),
        Wants::Draw(d) if d == DeviceDraw::plain(d.temperature, d.seed) => {
            (1.0 / d.temperature, d.seed)
        }
        ref w => panic!("{w:?} is not picked by this pass"),
    };
    let noise = |i: usize| {
        let mut z = seed ^ (i as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        let u = ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        -(-u.ln()).ln() as f32
    };
    let value = |i: usize| match inv_t {
        0.0 => logits[i],
        _ => logits[i] * inv_t + noise(i),
    };
    (0..logits.len()).fold(0, |b, i| if value(i) > value(b) { i } else { b }) as u32
}

/// Every event a request got: its text, tokens, log-probabilities and end.
#[derive(Debug, PartialEq)]
struct Seen {
    text: String,
    tokens: Vec<u32>,
    logprobs: Vec<TokenLogprob>,
    end: Option<String>,
}

fn seen(rx: &mut UnboundedReceiver<Event>) -> Seen {
    let mut s = Seen {
        text: String::new(),
        tokens: Vec::new(),
        logprobs: Vec::new(),
        end: None,
    };
    while let Ok(ev) = rx.try_recv() {
        match ev {
            Event::Delta {
                text,
                tokens,
                logprobs,
                ..
            } => {
                s.text.push_str(&text);
                s.tokens.extend(tokens);
                s.logprobs.extend(logprobs);
            }
            Event::Finished { reason, usage, .. } => {
                s.end = Some(format!("{reason:?} {}", usage.completion_tokens));
            }
            Event::Failed(why) | Event::Refused(why) => s.end = Some(format!("failed: {why}")),
        }
    }
    s
}

/// Submits `specs[i]` before step `arrive[i]`, cancels request `cancel` (if any) after step
/// `at`, and steps until idle.
fn serve(
    e: &mut Engine,
    specs: &[RequestSpec],
    arrive: &[usize],
    cancel: Option<(usize, usize)>,
) -> Vec<Seen> {
    let mut rxs: Vec<Option<UnboundedReceiver<Event>>> = specs.iter().map(|_| None).collect();
    let mut seens: Vec<Option<Seen>> = specs.iter().map(|_| None).collect();
    let mut step = 0;
    loop {
        for (i, s) in specs.iter().enumerate() {
            if arrive[i] == step {
                let (tx, rx) = unbounded_channel();
                e.submit(s.clone(), tx);
                rxs[i] = Some(rx);
            }
        }
        if let Some((i, at)) = cancel
            && at == step
        {
            seens[i] = Some(seen(rxs[i].as_mut().unwrap()));
            rxs[i] = None;
        }
        if e.is_idle() && arrive.iter().all(|&a| a < step) {
            break;
        }
        e.step();
        step += 1;
        assert!(step < 10_000, "engine made no progress");
    }
    rxs.iter_mut()
        .zip(seens)
        .map(|(rx, s)| s.unwrap_or_else(|| seen(rx.as_mut().unwrap())))
        .collect()
}

/// The same requests on the CPU pass and ahead on `AheadCpu`: the same events; returns the
/// metrics of the run ahead.
fn same_as_reading_each_step(
    m: &Arc<LoadedModel>,
    specs: &[RequestSpec],
    arrive: &[usize],
    pages: usize,
    cancel: Option<(usize, usize)>,
) -> Arc<Metrics> {
    let (mut read, _) = engine_on(m, Box::new(CpuPass), pages, 4, true);
    let want = serve(&mut read, specs, arrive, cancel);
    let (mut e, metrics) = engine_on(m, Box::new(AheadCpu::default()), pages, 4, true);
    let got = serve(&mut e, specs, arrive, cancel);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        if cancel.is_some_and(|(c, _)| c == i) {
            // Cancelled while running: its tokens reach it one step later ahead.
            let n = g.tokens.len();
            assert!(
                n + 1 >= w.tokens.len() && w.tokens.starts_with(&g.tokens),
                "request {i}"
            );
            assert!(w.text.starts_with(&g.text) && g.end.is_none() && w.end.is_none());
        } else {
            assert_eq!(g, w, "request {i}");
        }
    }
    let pool = metrics.pool();
    assert_eq!(pool.leaked, 0);
    assert_eq!(
        pool.used, pool.cached,
        "only the prefix cache holds pages when idle"
    );
    metrics
}

fn greedy(m: &Arc<LoadedModel>) -> Vec<RequestSpec> {
    let mut specs: Vec<RequestSpec> = (0..6)
        .map(|i| spec(&prompt(20 + i, 9 + 5 * i as usize), 14 + 3 * i as usize))
        .collect();
    // Request 1 ends on a stop token, request 2 on a stop string, both unforeseen.
    let free = |s: &RequestSpec| {
        let (mut e, _) = engine_on(m, Box::new(CpuPass), 256, 1, false);
        serve(&mut e, std::slice::from_ref(s), &[0], None)
            .remove(0)
            .tokens
    };
    let out = free(&specs[1]);
    specs[1].stop_tokens = vec![out[6]];
    let out = free(&specs[2]);
    specs[2].stop = vec![m.tokenizer.decode(&out[4..6])];
    // Request 3 ends on the model's end of generation, where it comes.
    specs[3].ignore_eos = false;
    specs
}

#[test]
fn ahead_outputs_equal_reading_each_step() {
    let m = model();
    let specs = greedy(&m);
    let metrics = same_as_reading_each_step(&m, &specs, &[0, 0, 2, 3, 9, 30], 256, None);
    assert!(
        metrics.steps_ahead() > 10,
        "{} steps went ahead",
        metrics.steps_ahead()
    );
    assert!(metrics.outcome("stop") >= 2);
    // A stop token or string ends its request unforeseen, with a row in flight (unless a
    // request arriving made that step read its tokens first).
    assert!(
        metrics.rows_dropped() >= 1,
        "{} rows dropped",
        metrics.rows_dropped()
    );
}

/// A request alone that ends on a stop token: the row computed ahead of it is dropped, and
/// its pages go back.
#[test]
fn an_unforeseen_stop_drops_one_row() {
    let m = model();
    let specs = &greedy(&m)[1..2];
    let metrics = same_as_reading_each_step(&m, specs, &[0], 64, None);
    assert_eq!(metrics.outcome("stop"), 1);
    assert_eq!(metrics.rows_dropped(), 1);
}

/// Requests asking for log-probabilities on a device that scores them there: greedy ones (and
/// one held to JSON) get the tokens and log-probabilities the host's sampler gives, every row
/// scored where its logits are, decoding ahead.
#[test]
fn logprobs_scored_on_the_device_equal_the_hosts() {
    let m = model();
    let grammar = Arc::new(Grammar::any_object());
    let mut specs = greedy(&m);
    for (i, s) in specs.iter_mut().enumerate() {
        s.logprobs = Some(i % 4);
    }
    specs[5].grammar = Some(grammar);
    let arrive = [0, 0, 2, 3, 9, 30];
    let (mut host, _) = engine_on(&m, Box::new(CpuPass), 256, 4, true);
    let want = serve(&mut host, &specs, &arrive, None);
    let pass = AheadCpu::default();
    let scored = pass.scored.clone();
    let (mut e, metrics) = engine_on(&m, Box::new(pass), 256, 4, true);
    let got = serve(&mut e, &specs, &arrive, None);
    // Decoding ahead batches rows otherwise, which may move a logit by a rounding step.
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            (&g.text, &g.tokens, &g.end),
            (&w.text, &w.tokens, &w.end),
            "request {i}"
        );
        assert_eq!(g.logprobs.len(), g.tokens.len());
        for (a, b) in g.logprobs.iter().zip(&w.logprobs) {
            let ids = |l: &TokenLogprob| l.top.iter().map(|t| t.0).collect::<Vec<_>>();
            assert_eq!((a.token, ids(a)), (b.token, ids(b)), "request {i}");
            assert!(
                (a.logprob - b.logprob).abs() < 1e-5,
                "request {i}: {a:?} {b:?}"
            );
        }
    }
    let tokens: usize = got.iter().map(|g| g.tokens.len()).sum();
    assert!(
        scored.load(Ordering::Relaxed) >= tokens,
        "{scored:?} of {tokens}"
    );
    assert!(
        metrics.steps_ahead() > 10,
        "{} steps went ahead",
        metrics.steps_ahead()
    );
}

/// Requests that sample on the host (log-probabilities, a repetition penalty) run beside greedy
/// ones: each such step reads its tokens first.
#[test]
fn ahead_steps_give_way_to_host_sampling() {
    let m = model();
    let mut specs = greedy(&m);
    specs[4].logprobs = Some(2);
    specs[5].sampling = SamplingParams {
        temperature: 0.9,
        repetition_penalty: 1.2,
        seed: 3,
        ..Default::default()
    };
    let metrics = same_as_reading_each_step(&m, &specs, &[0, 0, 0, 1, 20, 40], 256, None);
    assert!(
        metrics.steps_ahead() > 5,
        "{} steps went ahead",
        metrics.steps_ahead()
    );
}

#[test]
fn ahead_survives_cancellation_and_preemption() {
    let m = model();
    let specs: Vec<RequestSpec> = (0..4).map(|i| spec(&prompt(10 + i, 20), 24)).collect();
    // 20 pages for 4 requests of up to 44 tokens: some are preempted.
    let metrics = same_as_reading_each_step(&m, &specs, &[0, 0, 1, 1], 20, Some((1, 12)));
    assert!(metrics.preemptions() > 0, "the pool was meant to run out");
    assert!(metrics.steps_ahead() > 0, "no step went ahead");
}

/// Draws at a temperature picked ahead take the seeds they take reading each step.
#[test]
fn ahead_draws_take_the_seeds_of_reading_each_step() {
    let m = model();
    let mut specs = greedy(&m);
    for (i, s) in specs.iter_mut().enumerate().skip(2) {
        s.sampling = SamplingParams {
            temperature: 0.6 + 0.2 * i as f32,
            seed: i as u64,
            ..Default::default()
        };
    }
    let arrive = [0, 0, 2, 3, 9, 30];
    let (mut read, _) = engine_on(&m, Box::new(AheadCpu::default()), 256, 4, false);
    let want = serve(&mut read, &specs, &arrive, None);
    let (mut e, metrics) = engine_on(&m, Box::new(AheadCpu::default()), 256, 4, true);
    assert_eq!(serve(&mut e, &specs, &arrive, None), want);
    assert!(metrics.steps_ahead() > 10);
    // Draws from different seeds differ: the seeds matter to the outputs compared.
    let mut reseeded = specs.clone();
    reseeded[4].sampling.seed = 99;
    let (mut other, _) = engine_on(&m, Box::new(AheadCpu::default()), 256, 4, false);
    assert_ne!(serve(&mut other, &reseeded, &arrive, None)[4], want[4]);
}

/// With `decode_ahead` off, the engine reads every step's tokens first.
#[test]
fn decode_ahead_off_reads_each_step() {
    let m = model();
    let (mut e, metrics) = engine_on(&m, Box::new(AheadCpu::default()), 256, 4, false);
    let (tx, mut rx) = unbounded_channel();
    e.submit(spec(&prompt(1, 10), 12), tx);
    run_all(&mut e);
    assert_eq!(collect(&mut rx).1, FinishReason::Length);
    assert_eq!(metrics.steps_ahead(), 0);
}

/// A failed read of the picks fails the requests they were for; the next request runs as if
/// nothing had happened, not against picks nobody will take.
#[test]
fn a_failed_read_of_the_picks_fails_only_its_requests() {
    let m = model();
    let specs = greedy(&m);
    let (mut read, _) = engine_on(&m, Box::new(CpuPass), 256, 4, true);
    let want = serve(&mut read, &specs[..1], &[0], None).remove(0);
    let pass = AheadCpu {
        fail_read: 3,
        ..AheadCpu::default()
    };
    let (mut e, metrics) = engine_on(&m, Box::new(pass), 256, 4, true);
    let failed = serve(&mut e, &specs[4..5], &[0], None).remove(0);
    assert!(
        failed
            .end
            .as_deref()
            .is_some_and(|end| end.contains("the copy back failed")),
        "{:?}",
        failed.end
    );
    let after = serve(&mut e, &specs[..1], &[0], None).remove(0);
    assert_eq!(after, want);
    assert!(e.lost().is_none());
    assert_eq!(metrics.pool().leaked, 0);
}

/// Greedy and temperature requests whose free output holds a stop token (and the model's end
/// where it comes) early: with `min_tokens`, none of their first `min_tokens` tokens is an end
/// token, whether tokens are read each step, picked ahead on a device, or recomputed after
/// preemption; and ahead equals reading each step.
#[test]
fn min_tokens_hold_on_every_pick_path() {
    let m = model();
    let free = |s: &RequestSpec| {
        let (mut e, _) = engine_on(&m, Box::new(CpuPass), 256, 1, false);
        serve(&mut e, std::slice::from_ref(s), &[0], None)
            .remove(0)
            .tokens
    };
    let mut specs: Vec<RequestSpec> = (0..4).map(|i| spec(&prompt(40 + i, 20), 24)).collect();
    for (i, s) in specs.iter_mut().enumerate() {
        if i % 2 == 1 {
            s.sampling = SamplingParams {
                temperature: 0.8,
                seed: 7 + i as u64,
                ..Default::default()
            };
        }
        let out = free(s);
        // Ends on its second token without min_tokens.
        s.stop_tokens = vec![out[1], out[3]];
        s.min_tokens = 12;
    }
    for pages in [256, 20] {
        let (mut read, _) = engine_on(&m, Box::new(AheadCpu::default()), pages, 4, false);
        let want = serve(&mut read, &specs, &[0, 0, 1, 1], None);
        let (mut e, metrics) = engine_on(&m, Box::new(AheadCpu::default()), pages, 4, true);
        let got = serve(&mut e, &specs, &[0, 0, 1, 1], None);
        for (i, (g, s)) in got.iter().zip(&specs).enumerate() {
            assert!(g.tokens.len() >= s.min_tokens, "request {i}: {g:?}");
            assert!(
                !g.tokens[..s.min_tokens]
                    .iter()
                    .any(|t| s.stop_tokens.contains(t)),
                "request {i}: {g:?}"
            );
        }
        assert_eq!(got, want);
        if pages == 20 {
            assert!(metrics.preemptions() > 0);
        }
        assert!(metrics.steps_ahead() > 0);
    }
}

/// As vLLM, stop strings are looked for from token `min_tokens + 1` on: the first `min_tokens`
/// tokens' text is never cut by one.
#[test]
fn the_text_of_token_min_tokens_is_not_cut_by_a_stop_string() {
    let m = model();
    let s = spec(&prompt(9, 12), 10);
    let (mut e, _) = engine_on(&m, Box::new(CpuPass), 256, 1, false);
    let (tx, mut rx) = unbounded_channel();
    e.submit(s.clone(), tx);
    run_all(&mut e);
    let free = collect(&mut rx).0;
    // The first token with text of its own.
    let k = (0..free.len())
        .find(|&k| !m.tokenizer.decode(&free[k..k + 1]).is_empty())
        .unwrap();
    let stop = m.tokenizer.decode(&free[k..k + 1]);
    let head = m.tokenizer.decode(&free[..=k]);
    let mut s = s;
    s.stop = vec![stop.clone()];
    s.min_tokens = k + 1;
    let (mut e, _) = engine_on(&m, Box::new(CpuPass), 256, 1, false);
    let (tx, mut rx) = unbounded_channel();
    e.submit(s, tx);
    run_all(&mut e);
    let mut out = String::new();
    let mut generated = 0;
    while let Ok(ev) = rx.try_recv() {
        match ev {
            Event::Delta { text, .. } => out.push_str(&text),
            Event::Finished { usage, .. } => generated = usage.completion_tokens,
            Event::Failed(e) | Event::Refused(e) => panic!("{e}"),
        }
    }
    assert!(
        out.starts_with(&head),
        "min_tokens {}: the text {out:?} ({generated} tokens) lacks the first {} tokens' {head:?}",
        k + 1,
        k + 1
    );
}

/// Requests held to JSON beside free ones, with and without going ahead, on a device that
/// masks ahead and on one that does not: the held ones are picked under their grammar's mask
/// and write JSON (a whole object when they stop), the same tokens on every path. Masked
/// ahead, the batch goes ahead with them in it; otherwise only once they are out of it.
#[test]
fn requests_held_to_json_are_picked_under_their_mask() {
    let m = model();
    let grammar = Arc::new(Grammar::any_object());
    let mut specs: Vec<RequestSpec> = (0..6).map(|i| spec(&prompt(60 + i, 12), 60)).collect();
    for (i, s) in specs.iter_mut().enumerate() {
        s.sampling = SamplingParams {
            temperature: 0.9,
            seed: i as u64,
            ..Default::default()
        };
        if i % 2 == 0 {
            s.grammar = Some(grammar.clone());
        } else {
            // Going on after the held requests end, when the batch may go ahead.
            s.max_tokens = 100;
        }
    }
    let arrive = [0, 0, 1, 1, 2, 2];
    let (mut read, _) = engine_on(&m, Box::new(AheadCpu::default()), 256, 6, false);
    let want = serve(&mut read, &specs, &arrive, None);
    let pass = AheadCpu {
        no_masks_ahead: true,
        ..AheadCpu::default()
    };
    let (mut e, unmasked) = engine_on(&m, Box::new(pass), 256, 6, true);
    assert_eq!(serve(&mut e, &specs, &arrive, None), want);
    let pass = AheadCpu::default();
    let (masked, masked_ahead) = (pass.masked.clone(), pass.masked_ahead.clone());
    let (mut e, metrics) = engine_on(&m, Box::new(pass), 256, 6, true);
    let got = serve(&mut e, &specs, &arrive, None);
    assert_eq!(got, want);
    assert!(masked.load(Ordering::Relaxed) > 0);
    assert!(masked_ahead.load(Ordering::Relaxed) > 0);
    assert!(
        metrics.steps_ahead() > unmasked.steps_ahead(),
        "{} steps ahead masking ahead, {} not",
        metrics.steps_ahead(),
        unmasked.steps_ahead()
    );
    for (i, (g, s)) in got.iter().zip(&specs).enumerate() {
        let mut matcher = Matcher::new(grammar.clone());
        let json = matcher.advance(g.text.as_bytes());
        if s.grammar.is_some() {
            assert!(json, "request {i}: {g:?}");
            let stopped = g.end.as_deref().is_some_and(|e| e.starts_with("Stop"));
            assert_eq!(stopped, matcher.is_complete(), "request {i}: {g:?}");
        } else {
            assert!(!json, "request {i} writes free text: {g:?}");
        }
    }
    assert!(metrics.steps_ahead() > 0);
}

/// Greedy requests held to JSON pick the same tokens under the mask on a device, ahead of the
/// host, as sampled on the host; those that close their object end on it, their row in flight
/// dropped.
#[test]
fn greedy_requests_held_to_json_pick_as_the_host_samples() {
    let m = model();
    let grammar = Arc::new(Grammar::any_object());
    let specs: Vec<RequestSpec> = (0..4)
        .map(|i| RequestSpec {
            grammar: Some(grammar.clone()),
            ..spec(&prompt(70 + i, 12), 40)
        })
        .collect();
    let (mut host, _) = engine_on(&m, Box::new(CpuPass), 256, 4, false);
    let want = serve(&mut host, &specs, &[0, 0, 1, 1], None);
    let pass = AheadCpu::default();
    let (masked, masked_ahead) = (pass.masked.clone(), pass.masked_ahead.clone());
    let (mut e, metrics) = engine_on(&m, Box::new(pass), 256, 4, true);
    let got = serve(&mut e, &specs, &[0, 0, 1, 1], None);
    assert_eq!(got, want);
    assert!(masked.load(Ordering::Relaxed) >= 4);
    assert!(masked_ahead.load(Ordering::Relaxed) > 10);
    assert!(metrics.steps_ahead() > 10, "{}", metrics.steps_ahead());
    let stopped = got
        .iter()
        .filter(|g| g.end.as_deref().is_some_and(|e| e.starts_with("Stop")))
        .count();
    assert!(
        stopped > 0 && metrics.rows_dropped() > 0,
        "{stopped} stopped, {} rows dropped",
        metrics.rows_dropped()
    );
}

/// A request held to JSON with `min_tokens` is picked on the host while its end is held off,
/// then under its mask ahead of the host: the same tokens as reading each step.
#[test]
fn held_requests_with_min_tokens_go_ahead_once_their_end_is_free() {
    let m = model();
    let grammar = Arc::new(Grammar::any_object());
    let specs: Vec<RequestSpec> = (0..3)
        .map(|i| RequestSpec {
            grammar: Some(grammar.clone()),
            min_tokens: 6 + 2 * i as usize,
            ignore_eos: false,
            ..spec(&prompt(80 + i, 12), 30)
        })
        .collect();
    let (mut read, _) = engine_on(&m, Box::new(AheadCpu::default()), 256, 4, false);
    let want = serve(&mut read, &specs, &[0, 0, 1], None);
    let pass = AheadCpu::default();
    let masked_ahead = pass.masked_ahead.clone();
    let (mut e, metrics) = engine_on(&m, Box::new(pass), 256, 4, true);
    assert_eq!(serve(&mut e, &specs, &[0, 0, 1], None), want);
    assert!(masked_ahead.load(Ordering::Relaxed) > 0);
    assert!(metrics.steps_ahead() > 0);
}
