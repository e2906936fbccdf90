//! The engine: one loop owns the running batch, the KV pool and the prefix cache. Every step it
//! drops cancelled requests, admits waiting ones, plans tokens under the step budget, makes
//! room (evicting cached pages, then preempting the newest requests), runs one forward pass
//! and samples. On a device that picks tokens itself, decode steps may run one ahead of the host
//! (`ahead.rs`).

mod ahead;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;
use tokio::sync::mpsc::UnboundedSender;
use vortex_flow::runner::FlowRunner;
use vortex_kv::Sequence;
use vortex_model::grammar::{Constraint, Vocabulary};
use vortex_model::loader::LoadedModel;
use vortex_model::model::{
    CpuPass, ForwardError, ForwardPass, KvState, Next, PromptRows, SeqStep, Wants,
};

use crate::active::Active;
use crate::metrics::{Metrics, PoolGauges, RequestTimes};
use crate::prefix_cache::{Inserted, PrefixCache, chain_hash};
use crate::request::{
    Event, FinishReason, FlowChoice, RequestSpec, TokenLogprob, Usage, token_logprob,
};
use crate::scheduler::{StepBudget, plan};

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Requests in the running batch at most.
    pub max_running: usize,
    pub budget: StepBudget,
    pub prefix_caching: bool,
    /// Name of the flow the KV state was built with (index 0).
    pub default_flow: String,
    /// Queue each decode step before the host has read the last one's tokens, where the
    /// forward pass can pick them on its device (see `ahead.rs`).
    pub decode_ahead: bool,
}

pub struct Engine {
    model: Arc<LoadedModel>,
    pass: Box<dyn ForwardPass>,
    kv: KvState,
    cfg: EngineConfig,
    /// Loaded flows by index (see [`KvState::flow_at`]).
    flows: Vec<String>,
    /// Flows the pass could not load, and why: a request for one fails at once instead of
    /// stalling the batch with another attempt.
    unloadable: Vec<(String, String)>,
    waiting: VecDeque<Active>,
    running: Vec<Active>,
    prefix: PrefixCache,
    metrics: Arc<Metrics>,
    /// Why the device can run nothing more, once it cannot: every request then fails.
    lost: Option<String>,
    /// Rows of the queued pass whose tokens the host has not taken in (0: none).
    ahead_rows: usize,
    /// The model's vocabulary for constrained decoding, built for the first request with a
    /// grammar.
    vocabulary: Option<Arc<Vocabulary>>,
}

impl Engine {
    /// An engine whose forward passes run on the CPU.
    pub fn new(
        model: Arc<LoadedModel>,
        kv: KvState,
        cfg: EngineConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self::with_pass(model, Box::new(CpuPass), kv, cfg, metrics)
    }

    /// An engine whose forward passes run on `pass` (a device backend); `kv` then only
    /// allocates pages (its layers may hold no storage).
    pub fn with_pass(
        model: Arc<LoadedModel>,
        pass: Box<dyn ForwardPass>,
        kv: KvState,
        cfg: EngineConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        let flows = vec![cfg.default_flow.clone()];
        let e = Self {
            model,
            pass,
            kv,
            cfg,
            flows,
            unloadable: Vec::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            prefix: PrefixCache::default(),
            metrics,
            lost: None,
            ahead_rows: 0,
            vocabulary: None,
        };
        e.publish_pool();
        e
    }

    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// Why the engine stopped for good (its device failed), if it did.
    pub fn lost(&self) -> Option<&str> {
        self.lost.as_deref()
    }

    /// Queues a request; a request that can never run (or never fit the KV pool) fails at
    /// once.
    pub fn submit(&mut self, spec: RequestSpec, events: UnboundedSender<Event>) {
        if let Some(why) = &self.lost {
            let _ = events.send(Event::Failed(format!("the engine has stopped: {why}")));
            self.metrics.finished("rejected", None);
            return;
        }
        if let Err(e) = self.check(&spec) {
            let _ = events.send(Event::Refused(e));
            self.metrics.finished("rejected", None);
            return;
        }
        // The tokens `min_tokens` holds off: only a request with one needs them.
        let mut end = Vec::new();
        if spec.min_tokens > 0 {
            end.extend_from_slice(&spec.stop_tokens);
            if !spec.ignore_eos {
                end.extend_from_slice(self.model.tokenizer.eog_ids());
                end.extend_from_slice(&self.model.stop_tokens);
            }
        }
        let constraint = spec.grammar.clone().map(|g| self.constraint(g, &spec));
        self.waiting
            .push_back(Active::new(spec, events, end, constraint));
        self.publish_pool();
    }

    /// A request's grammar over the model's vocabulary; every token that ends its generation
    /// ends the reply.
    fn constraint(
        &mut self,
        grammar: Arc<vortex_model::grammar::Grammar>,
        spec: &RequestSpec,
    ) -> Constraint {
        let tok = &self.model.tokenizer;
        let vocabulary = self
            .vocabulary
            .get_or_insert_with(|| Arc::new(Vocabulary::of(tok)))
            .clone();
        let mut end = tok.eog_ids().to_vec();
        end.extend_from_slice(&self.model.stop_tokens);
        end.extend_from_slice(&spec.stop_tokens);
        Constraint::new(grammar, vocabulary, end)
    }

    fn check(&self, spec: &RequestSpec) -> Result<(), String> {
        let cfg = &self.model.model.config;
        if spec.prompt.is_empty() {
            return Err("the prompt is empty".into());
        }
        if spec.prompt_logprobs.is_some() && !self.pass.scores_prompts() {
            return Err(format!(
                "this engine's forward pass on {} does not compute prompt log-probabilities",
                self.pass.device()
            ));
        }
        if let Some(&t) = spec.prompt.iter().find(|&&t| t as usize >= cfg.vocab) {
            return Err(format!(
                "token id {t} is outside the vocabulary of {}",
                cfg.vocab
            ));
        }
        let tokens = spec.prompt.len().saturating_add(spec.max_tokens);
        if tokens > cfg.max_positions {
            return Err(format!(
                "the prompt and max_tokens reach {tokens} tokens, past the model's context of {}",
                cfg.max_positions
            ));
        }
        let pages = self.kv.cache.geometry().pages_for(tokens);
        let total = self.kv.cache.allocator().total();
        if pages > total {
            return Err(format!(
                "the request needs {pages} KV pages (prompt and max_tokens), the pool holds {total}"
            ));
        }
        Ok(())
    }

    /// One scheduling step and forward pass. Returns false when there was nothing to run.
    pub fn step(&mut self) -> bool {
        if self.ahead_rows > 0 {
            if self.continues_ahead() {
                self.step_ahead();
                self.publish_pool();
                return true;
            }
            self.settle();
        }
        self.drop_cancelled();
        self.admit();
        if self.running.is_empty() {
            self.publish_pool();
            return false;
        }
        let take = self.make_room();
        self.forward(&take);
        self.publish_pool();
        true
    }

    fn drop_cancelled(&mut self) {
        // Most steps have nothing to drop. Otherwise one look at each client decides: one that
        // left between two looks would go uncounted.
        if self.waiting.iter().any(Active::cancelled) {
            let (gone, kept) = std::mem::take(&mut self.waiting)
                .into_iter()
                .partition::<Vec<_>, _>(Active::cancelled);
            self.waiting = kept.into();
            for mut a in gone {
                self.kv.cache.free(&mut a.seq);
                self.metrics.generated(a.generated);
                self.metrics.finished("cancelled", None);
            }
        }
        for i in (0..self.running.len()).rev() {
            if self.running[i].cancelled() {
                let mut a = self.running.remove(i);
                self.kv.cache.free(&mut a.seq);
                self.metrics.generated(a.generated);
                self.metrics.finished("cancelled", None);
            }
        }
    }

    /// Moves waiting requests into the batch, in arrival order, while their prompts fit.
    fn admit(&mut self) {
        // Most steps only decode: the pool's accounting below walks the prefix cache.
        if self.waiting.is_empty() || self.running.len() >= self.cfg.max_running {
            return;
        }
        let geom = self.kv.cache.geometry();
        let p = geom.page_size;
        // Pages free or freeable, against the pages every running request still needs for
        // what it has to compute, and one of growth each.
        let alloc = self.kv.cache.allocator();
        let mut room = alloc.free_count() + self.prefix.evictable(&self.kv.cache);
        let mut reserved: usize = self
            .running
            .iter()
            .map(|a| {
                geom.pages_for(a.tokens_after_step())
                    .saturating_sub(a.seq.pages.len())
            })
            .sum();
        while self.running.len() < self.cfg.max_running {
            let Some(a) = self.waiting.front() else {
                break;
            };
            let limit = if self.cfg.prefix_caching && a.spec.prompt_logprobs.is_none() {
                // At least two prompt tokens are computed: a lone pending token decodes
                // through the flow, and the prompt's last one must go through the prefill as
                // it does without a hit.
                a.spec.prompt.len().saturating_sub(2) / p
            } else {
                0
            };
            let hit = self.prefix.lookup(&a.tokens, p, limit);
            let cached = hit.pages.len() * p;
            let needed = geom.pages_for(a.tokens_after_step()) - hit.pages.len();
            // The hit's pages stop being evictable once the request holds them.
            let alloc = self.kv.cache.allocator();
            let held_hits = hit
                .pages
                .iter()
                .filter(|&&page| alloc.refs(page) == 1)
                .count();
            if reserved + needed + held_hits > room && !self.running.is_empty() {
                break;
            }
            let mut a = self.waiting.pop_front().expect("front exists");
            if let Err(e) = self.bind_flow(&mut a) {
                // Before any page or token: the request goes back as refused.
                let _ = a.events.send(Event::Refused(e));
                self.metrics.finished("rejected", None);
                continue;
            }
            room = room.saturating_sub(held_hits);
            reserved += needed;
            for &page in &hit.pages {
                self.kv.cache.retain_page(page);
            }
            a.seq = Sequence {
                pages: hit.pages,
                len: cached,
            };
            a.hashes = hit.hashes;
            if a.admitted.is_none() {
                a.admitted = Some(Instant::now());
                a.cached_tokens = cached;
                self.metrics
                    .admitted(&a.flow.0, a.spec.prompt.len(), cached);
            } else {
                self.metrics.readmitted(cached);
            }
            self.running.push(a);
        }
    }

    /// Resolves the request's flow to a loaded one, loading it the first time it is asked for.
    fn bind_flow(&mut self, a: &mut Active) -> Result<(), String> {
        let (name, index) = match &a.spec.flow {
            None => (self.flows[0].clone(), 0),
            Some(choice) => match self.flows.iter().position(|n| *n == choice.name) {
                Some(i) => (choice.name.clone(), i),
                None => (choice.name.clone(), self.load_flow(choice)?),
            },
        };
        let (runner, _) = self.kv.flow_at(index).ok_or("flow index out of range")?;
        a.state = runner.new_state(self.model.model.config.layers);
        a.state.flow = index;
        a.flow = (name, index);
        Ok(())
    }

    /// Loads flows requests may choose before any request runs (on a device, so that their
    /// summaries have memory set aside before the KV pool takes it).
    pub fn load_flows(&mut self, flows: &[FlowChoice]) -> Result<(), String> {
        for choice in flows {
            if !self.flows.contains(&choice.name) {
                self.load_flow(choice)?;
            }
        }
        Ok(())
    }

    /// Loads `choice` beside the loaded flows, summarising every complete page that could be
    /// attended; returns its index.
    fn load_flow(&mut self, choice: &FlowChoice) -> Result<usize, String> {
        if let Some((_, why)) = self.unloadable.iter().find(|u| u.0 == choice.name) {
            return Err(why.clone());
        }
        let p = self.kv.cache.geometry().page_size;
        let cached = Sequence {
            pages: self.prefix.pages().collect(),
            len: self.prefix.len() * p,
        };
        let mut seqs: Vec<&Sequence> = self.running.iter().map(|r| &r.seq).collect();
        seqs.push(&cached);
        if let Err(why) = self.pass.load_flow(&choice.flow, &seqs) {
            self.unloadable.push((choice.name.clone(), why.clone()));
            return Err(why);
        }
        let i = self
            .kv
            .add_flow(FlowRunner::new(choice.flow.clone()), &seqs);
        self.flows.push(choice.name.clone());
        Ok(i)
    }

    /// Plans this step's tokens and frees pages until they fit: first least recently used
    /// prefix-cache pages, then whole requests, newest first (they are recomputed later).
    fn make_room(&mut self) -> Vec<usize> {
        loop {
            let pending: Vec<usize> = self.running.iter().map(Active::plannable).collect();
            let take = plan(&pending, self.cfg.budget);
            let needed: usize = self
                .running
                .iter()
                .zip(&take)
                .map(|(a, &n)| self.kv.cache.pages_needed(&a.seq, n))
                .sum();
            let free = self.kv.cache.allocator().free_count();
            if needed <= free {
                return take;
            }
            let evicted = self.prefix.evict(&mut self.kv.cache, needed - free);
            if evicted >= needed - free {
                continue;
            }
            if self.running.len() <= 1 {
                // Admission guarantees one request fits an otherwise empty pool.
                return take;
            }
            let mut a = self.running.pop().expect("more than one running");
            self.kv.cache.free(&mut a.seq);
            a.hashes.clear();
            a.collided = false;
            // Recomputed from its prompt when readmitted, which binds a new state; a GPU's
            // state slot goes back now.
            a.state = Default::default();
            self.metrics.preempted();
            self.waiting.push_front(a);
        }
    }

    fn forward(&mut self, take: &[usize]) {
        let scores = self.pass.scores_logprobs();
        let wants: Vec<Wants> = self
            .running
            .iter_mut()
            .zip(take)
            .filter(|&(_, &n)| n > 0)
            .map(|(a, &n)| wants_of(a, n, scores))
            .collect();
        let mut scoring = PromptScoring::plan(&self.running, take);
        // A step that decodes one token of every request, each picked on the device, can be
        // the first one queued ahead.
        let ahead = self.cfg.decode_ahead
            && self
                .running
                .iter()
                .zip(take)
                .all(|(a, &n)| n == 1 && a.pending() == 1)
            && wants.iter().all(|w| self.pass.picks_ahead(w))
            && scoring.seqs.is_empty();
        let mut batch: Vec<SeqStep> = Vec::new();
        for (a, &n) in self.running.iter_mut().zip(take) {
            if n == 0 {
                continue;
            }
            let start = a.seq.len;
            let Active {
                seq,
                state,
                spec,
                tokens,
                ..
            } = a;
            batch.push(SeqStep {
                seq,
                state,
                settings: &spec.settings,
                tokens: &tokens[start..start + n],
            });
        }
        if batch.is_empty() {
            return;
        }
        let stepped: Vec<usize> = (0..take.len()).filter(|&i| take[i] > 0).collect();
        if ahead {
            let queued = self
                .pass
                .queue_decode(&self.model.model, &mut self.kv, &mut batch, false)
                .and_then(|()| self.pass.pick_ahead(&wants));
            drop(batch);
            match queued {
                Ok(()) => self.went_ahead(),
                Err(e) => self.pass_failed(&stepped, e),
            }
            return;
        }
        let result = if scoring.seqs.is_empty() {
            self.pass
                .forward(&self.model.model, &mut self.kv, &mut batch, &wants)
        } else {
            let rows = scoring.rows();
            let model = &self.model.model;
            let scored = self
                .pass
                .forward_scoring(model, &mut self.kv, &mut batch, &wants, &rows);
            scored.map(|(next, scores)| {
                scoring.take(scores);
                next
            })
        };
        drop(batch);
        if result.is_ok() {
            self.send_prompt_scores(scoring);
        }
        match result {
            Ok(next) if next.len() != stepped.len() => {
                let why = format!(
                    "forward pass: {} results for {} sequences",
                    next.len(),
                    stepped.len()
                );
                for &i in stepped.iter().rev() {
                    let a = self.running.remove(i);
                    self.fail(a, why.clone());
                }
            }
            Ok(next) => {
                for &i in &stepped {
                    self.cache_prompt_pages(i);
                }
                // Rows whose prompt is all in pick their token, where they generate, in
                // parallel: a sampler is a pass or more over the vocabulary.
                let mut rows: Vec<Option<Next>> = vec![None; self.running.len()];
                for (&i, n) in stepped.iter().zip(next) {
                    let a = &self.running[i];
                    rows[i] = Some(n).filter(|_| a.pending() == 0 && a.generates());
                }
                let picks: Vec<Option<Result<Pick, String>>> = self
                    .running
                    .par_iter_mut()
                    .zip(rows)
                    .map(|(a, n)| n.map(|n| pick(a, n)))
                    .collect();
                let mut done = Vec::new();
                for (i, p) in picks.into_iter().enumerate() {
                    let a = &self.running[i];
                    let end = match p {
                        Some(p) => self.give(i, p),
                        // The prompt alone, now in: nothing is sampled.
                        None if a.pending() == 0 && !a.generates() => {
                            Some(Ok(FinishReason::Length))
                        }
                        None => None,
                    };
                    if let Some(end) = end {
                        done.push((i, end));
                    }
                }
                self.end(done);
            }
            Err(e) => self.pass_failed(&stepped, e),
        }
    }

    /// Sends the prompt log-probabilities a pass computed to their requests, each position
    /// once.
    fn send_prompt_scores(&mut self, scoring: PromptScoring) {
        for s in scoring.seqs {
            let a = &mut self.running[s.running];
            let (start, end) = (s.start, s.start + s.scores.len());
            // A request recomputed after a preemption scores its rows again: sent once.
            let fresh: Vec<TokenLogprob> = s
                .scores
                .into_iter()
                .enumerate()
                .filter(|&(r, _)| start + r >= a.prompt_scored)
                .map(|(_, s)| s)
                .collect();
            a.prompt_scored = a.prompt_scored.max(end);
            if !fresh.is_empty() {
                let _ = a.events.send(Event::Delta {
                    text: String::new(),
                    tokens: vec![],
                    logprobs: vec![],
                    prompt: fresh,
                });
            }
        }
    }

    /// Streams request `i`'s picked token; returns how it ends, if it does.
    fn give(&mut self, i: usize, p: Result<Pick, String>) -> Option<Result<FinishReason, String>> {
        match p {
            Ok(p) => deliver(&self.model, &mut self.running[i], p).map(Ok),
            Err(why) => Some(Err(why)),
        }
    }

    /// Ends the running requests `done` (in ascending order): finished or failed.
    fn end(&mut self, done: Vec<(usize, Result<FinishReason, String>)>) {
        for (i, end) in done.into_iter().rev() {
            let a = self.running.remove(i);
            match end {
                Ok(reason) => self.finish(a, reason),
                Err(why) => self.fail(a, why),
            }
        }
    }

    /// Fails the running requests `stepped` (in ascending order) of a pass that failed; when
    /// the device is lost, every request.
    fn pass_failed(&mut self, stepped: &[usize], e: ForwardError) {
        for &i in stepped.iter().rev() {
            let a = self.running.remove(i);
            self.fail(a, format!("forward pass: {e}"));
        }
        if matches!(e, ForwardError::DeviceLost(_)) {
            // Nothing more can run: every other request fails now rather than later.
            let why = e.to_string();
            let rest: Vec<Active> = self
                .running
                .drain(..)
                .chain(self.waiting.drain(..))
                .collect();
            for a in rest {
                self.fail(a, why.clone());
            }
            self.lost = Some(why);
        }
    }

    /// Ends a request with an error, giving its pages back.
    fn fail(&mut self, mut a: Active, why: String) {
        self.kv.cache.free(&mut a.seq);
        let _ = a.events.send(Event::Failed(why));
        self.metrics.generated(a.generated);
        self.metrics.finished("error", None);
    }

    /// Puts request `i`'s newly completed prompt pages into the prefix cache.
    fn cache_prompt_pages(&mut self, i: usize) {
        if !self.cfg.prefix_caching {
            return;
        }
        let p = self.kv.cache.geometry().page_size;
        let a = &mut self.running[i];
        let complete = a.seq.len.min(a.spec.prompt.len()) / p;
        while a.hashes.len() < complete {
            let k = a.hashes.len();
            let parent = a.hashes.last().copied().unwrap_or(0);
            let tokens = &a.tokens[k * p..(k + 1) * p];
            let h = chain_hash(parent, tokens);
            let own = a.seq.pages[k];
            if !a.collided {
                match self
                    .prefix
                    .insert(&mut self.kv.cache, h, parent, tokens, own)
                {
                    Inserted::Cached(page) if page != own => {
                        // Another request computed the same page first: hold its copy instead.
                        self.kv.cache.retain_page(page);
                        self.kv.cache.release_page(own);
                        a.seq.pages[k] = page;
                    }
                    Inserted::Collision => a.collided = true,
                    _ => {}
                }
            }
            a.hashes.push(h);
        }
    }

    fn finish(&mut self, mut a: Active, reason: FinishReason) {
        let mut text = String::new();
        if reason == FinishReason::Length {
            let rest = a.decoder.finish();
            a.stream_text(&rest, &mut |t| text.push_str(t));
        }
        a.stop.flush(&mut |t| text.push_str(t));
        if !text.is_empty() {
            let _ = a.events.send(Event::Delta {
                text,
                tokens: vec![],
                logprobs: vec![],
                prompt: vec![],
            });
        }
        self.kv.cache.free(&mut a.seq);
        let now = Instant::now();
        let secs = |t: Instant| now.duration_since(t).as_secs_f64();
        let times = RequestTimes {
            queue: a
                .admitted
                .map_or(0.0, |t| t.duration_since(a.arrival).as_secs_f64()),
            ttft: a
                .first_token
                .map(|t| t.duration_since(a.arrival).as_secs_f64()),
            tpot: a
                .first_token
                .filter(|_| a.generated > 1)
                .map(|t| secs(t) / (a.generated - 1) as f64),
            e2e: secs(a.arrival),
        };
        self.metrics.generated(a.generated);
        self.metrics.finished(reason.as_str(), Some(times));
        let _ = a.events.send(Event::Finished {
            reason,
            usage: Usage {
                prompt_tokens: a.spec.prompt.len(),
                completion_tokens: a.generated,
                cached_tokens: a.cached_tokens,
            },
            flow: a.flow.0.clone(),
        });
    }

    /// Pool gauges; `leaked` counts used pages that no request and no cache entry holds.
    fn publish_pool(&self) {
        let alloc = self.kv.cache.allocator();
        let mut held = vec![false; alloc.total()];
        let pages = self
            .running
            .iter()
            .chain(&self.waiting)
            .flat_map(|a| a.seq.pages.iter().copied())
            .chain(self.prefix.pages());
        for p in pages {
            held[p as usize] = true;
        }
        let held = held.iter().filter(|&&h| h).count();
        self.metrics.set_pool(PoolGauges {
            total: alloc.total(),
            used: alloc.used_count(),
            cached: self.prefix.len(),
            leaked: alloc.used_count().saturating_sub(held),
            running: self.running.len(),
            waiting: self.waiting.len(),
        });
    }
}

/// What a pass gives back for a request that computes `n` of its pending tokens: nothing
/// before its prompt is in or where it generates nothing, else its token picked where the
/// logits are (with its log-probabilities there, where the pass `scores` them), or its logits.
fn wants_of(a: &mut Active, n: usize, scores: bool) -> Wants {
    if a.pending() > n || !a.generates() {
        return Wants::Nothing;
    }
    if a.spec.logprobs.is_some() && !scores {
        return Wants::Logits;
    }
    device_pick(a).map_or(Wants::Logits, |w| scored(a, w))
}

/// `pick`, with the log-probabilities `a` asks for.
fn scored(a: &Active, pick: Wants) -> Wants {
    match a.spec.logprobs {
        Some(k) => Wants::Scored(Box::new(pick), k),
        None => pick,
    }
}

/// The pick a device can make for `a`, if nothing the host applies changes its logits.
fn device_pick(a: &mut Active) -> Option<Wants> {
    if a.sampler.is_plain_greedy() {
        Some(Wants::Argmax)
    } else if let Some(draw) = a.sampler.device_draw() {
        Some(Wants::Draw(draw))
    } else {
        let (draw, allowed) = a.sampler.masked_device_draw()?;
        Some(Wants::MaskedDraw(draw, Arc::new(allowed)))
    }
}

/// A request's next token, and its log-probabilities when the request asks for them.
struct Pick {
    token: u32,
    logprob: Option<TokenLogprob>,
}

/// The next token of `a`: sampled from the logits, or the one the pass chose as asked.
fn pick(a: &mut Active, next: Next) -> Result<Pick, String> {
    match next {
        Next::Logits(mut logits) => {
            let raw = a.spec.logprobs.map(|_| logits.clone());
            let token = a.sampler.sample(&mut logits);
            if a.sampler.off_grammar() {
                return Err(format!(
                    "the reply's grammar allows no token here (not even an end token); token \
                     {token} would break it"
                ));
            }
            Ok(Pick {
                token,
                logprob: raw
                    .zip(a.spec.logprobs)
                    .map(|(raw, k)| token_logprob(&raw, token, k)),
            })
        }
        Next::Scored {
            token,
            logprob,
            mut top,
        } if a.spec.logprobs.is_some() && picks_on_device(a) => {
            top.truncate(a.spec.logprobs.unwrap_or(0));
            let logprob = TokenLogprob {
                token,
                logprob,
                top,
            };
            take_device_pick(a, token, Some(logprob))
        }
        Next::Token(token) if a.spec.logprobs.is_none() && picks_on_device(a) => {
            take_device_pick(a, token, None)
        }
        other => Err(format!(
            "forward pass: {other:?} for a request that samples its next token"
        )),
    }
}

/// Records `token`, picked on a device, as `a`'s next.
fn take_device_pick(
    a: &mut Active,
    token: u32,
    logprob: Option<TokenLogprob>,
) -> Result<Pick, String> {
    if !a.sampler.allows(token) {
        return Err(format!(
            "forward pass: token {token}, which the reply's grammar does not allow"
        ));
    }
    a.sampler.record(token);
    Ok(Pick { token, logprob })
}

/// Whether a device may have picked `a`'s token: nothing the host applies changes its logits.
fn picks_on_device(a: &Active) -> bool {
    a.sampler.is_plain_greedy() || a.sampler.device_draw().is_some() || a.sampler.picks_under_mask()
}

/// Streams a picked token. Returns why the request ends, if it does.
fn deliver(model: &LoadedModel, a: &mut Active, pick: Pick) -> Option<FinishReason> {
    let token = pick.token;
    if a.first_token.is_none() {
        a.first_token = Some(Instant::now());
    }
    let tok = &model.tokenizer;
    let eog = tok.is_eog(token) || model.stop_tokens.contains(&token);
    // A grammar offers an end token only where its reply may end: `ignore_eos` cannot write
    // past it (the end token's text would break the JSON).
    let ends = eog && (!a.spec.ignore_eos || a.spec.grammar.is_some());
    if ends || a.spec.stop_tokens.contains(&token) {
        return Some(FinishReason::Stop);
    }
    a.tokens.push(token);
    a.generated += 1;
    let piece = a.decoder.push(tok, token);
    let mut text = String::new();
    let hit_stop = a.stream_text(&piece, &mut |t| text.push_str(t));
    let logprobs: Vec<TokenLogprob> = pick.logprob.into_iter().collect();
    let _ = a.events.send(Event::Delta {
        text,
        tokens: vec![token],
        logprobs,
        prompt: vec![],
    });
    if hit_stop || a.sampler.grammar_finished() {
        Some(FinishReason::Stop)
    } else if a.generated >= a.spec.max_tokens || a.tokens.len() >= model.model.config.max_positions
    {
        Some(FinishReason::Length)
    } else {
        None
    }
}

/// The prompt rows of a pass whose log-probabilities are asked for (`prompt_logprobs`), and
/// those computed.
struct PromptScoring {
    seqs: Vec<ScoredSeq>,
}

/// A sequence's first new rows whose next token is a prompt token.
struct ScoredSeq {
    /// Its index among the running requests.
    running: usize,
    /// Its index in the pass's batch.
    batch: usize,
    /// The position of its first new row.
    start: usize,
    /// The prompt token after each row.
    next: Vec<u32>,
    /// Alternatives asked for.
    top: usize,
    scores: Vec<TokenLogprob>,
}

impl PromptScoring {
    fn plan(running: &[Active], take: &[usize]) -> PromptScoring {
        let mut seqs = Vec::new();
        let stepped = running
            .iter()
            .zip(take)
            .enumerate()
            .filter(|&(_, (_, &n))| n > 0);
        for (b, (i, (a, &n))) in stepped.enumerate() {
            let Some(top) = a.spec.prompt_logprobs else {
                continue;
            };
            let (start, prompt) = (a.seq.len, &a.spec.prompt);
            // Row `start + r` is followed by prompt token `start + r + 1`.
            let end = (start + n + 1).min(prompt.len());
            if end > start + 1 {
                seqs.push(ScoredSeq {
                    running: i,
                    batch: b,
                    start,
                    next: prompt[start + 1..end].to_vec(),
                    top,
                    scores: Vec::new(),
                });
            }
        }
        PromptScoring { seqs }
    }

    fn rows(&self) -> Vec<PromptRows<'_>> {
        let rows = self.seqs.iter().map(|s| PromptRows {
            seq: s.batch,
            next: &s.next,
            top: s.top,
        });
        rows.collect()
    }

    /// The pass's scores, an entry of [`rows`](Self::rows) each.
    fn take(&mut self, scores: Vec<Vec<TokenLogprob>>) {
        for (s, scores) in self.seqs.iter_mut().zip(scores) {
            s.scores = scores;
        }
    }
}
