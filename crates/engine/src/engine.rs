//! The engine: one loop owns the running batch, the KV pool and the prefix cache. Every step it
//! drops cancelled requests, admits waiting ones, plans tokens under the step budget, makes
//! room (evicting cached pages, then preempting the newest requests), runs one forward pass
//! and takes its results in. Who is in the batch: `admission.rs`; tokens picked and streamed:
//! `picks.rs`; prompt log-probabilities: `prompt_scoring.rs`; requests ended: `ending.rs`;
//! flows bound and loaded: `flows.rs`. On a device that picks tokens itself, decode steps may
//! run one ahead of the host (`ahead.rs`).

mod admission;
mod ahead;
mod ending;
mod flows;
mod picks;
mod prompt_scoring;

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;
use vortex_model::grammar::{Constraint, Vocabulary};
use vortex_model::loader::LoadedModel;
use vortex_model::model::{CpuPass, ForwardPass, KvState, SeqStep, Wants};

use crate::active::Active;
use crate::metrics::{Metrics, PoolGauges};
use crate::prefix_cache::{Inserted, PrefixCache, chain_hash};
use crate::request::{Event, RequestSpec};
use crate::scheduler::StepBudget;
use picks::wants_of;
use prompt_scoring::PromptScoring;

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
            && scoring.is_empty();
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
        let result = if scoring.is_empty() {
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
            Ok(next) => self.take_pass(&stepped, next),
            Err(e) => self.pass_failed(&stepped, e),
        }
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
