//! Runs an evaluation: every sample is prefilled once (prefill is dense whatever the flow), then
//! each flow decodes the answer on a copy-on-write fork of the prefilled sequence, with attention
//! fidelity measured on its first decode steps and, optionally, its decode speed.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use vortex_flow::runner::FlowRunner;
use vortex_flow::{Flow, Settings};
use vortex_kv::{KvCache, KvDtype, KvGeometry, Sequence};
use vortex_model::generate::prefill_chunks;
use vortex_model::model::{KvState, Model, SeqStep};
use vortex_model::sampling::argmax;
use vortex_model::tokenizer::Tokenizer;

use crate::fidelity::{Fidelity, FidelityProbe};
use crate::score::exact_match;
use crate::tasks::{MIN_FILLER_TOKENS, Sample, Task, fixed_tokens, sample};

/// The most samples of each task and length a plan may ask for.
pub const MAX_SAMPLES: usize = 1 << 20;

/// One flow at one setting, as a column of the results.
#[derive(Debug, Clone)]
pub struct FlowSpec {
    /// Shown in tables, e.g. `quest 1/8`.
    pub label: String,
    /// The checked flow; its settings are the ones the steps use.
    pub flow: Flow,
    /// Specs with the same `source` share page summaries (same flow, other settings).
    pub source: usize,
}

#[derive(Debug, Clone)]
pub struct EvalPlan {
    pub tasks: Vec<Task>,
    /// Context lengths in tokens: prompt and answer together fit in each.
    pub lengths: Vec<usize>,
    pub flows: Vec<FlowSpec>,
    pub samples: usize,
    pub seed: u64,
    /// Decode steps of each answer on which fidelity is measured (0: none).
    pub fidelity_steps: usize,
    /// Fidelity is measured in layers 0, s, 2s, ...
    pub fidelity_layer_stride: usize,
    /// Tokens decoded per flow, after the answer of each length's first sample, to time decoding
    /// (0: no speed measurement).
    pub speed_tokens: usize,
    pub page_size: usize,
    pub kv_dtype: KvDtype,
    pub prefill_chunk: usize,
    /// End-of-generation tokens beyond the tokenizer's own.
    pub stop_tokens: Vec<u32>,
}

/// One flow's answer to one sample.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SampleResult {
    pub task: Task,
    pub length: usize,
    pub index: usize,
    pub flow: String,
    pub correct: bool,
    pub output: String,
    pub answers: Vec<String>,
    pub prompt_tokens: usize,
    pub depth: Option<f64>,
    pub fidelity: Fidelity,
}

/// Decode speed of one flow at one context length.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpeedResult {
    pub flow: String,
    pub length: usize,
    pub context_tokens: usize,
    pub tokens: usize,
    pub tokens_per_s: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EvalResults {
    pub samples: Vec<SampleResult>,
    pub speed: Vec<SpeedResult>,
}

/// What the runner is doing, for a progress display.
pub enum Progress<'a> {
    /// A sample was generated and prefilled.
    Prefilled {
        done: usize,
        total: usize,
        task: Task,
        length: usize,
        index: usize,
        prompt_tokens: usize,
        secs: f64,
    },
    /// One flow answered one sample.
    Answered(&'a SampleResult),
    /// One flow's decode speed was measured.
    Timed(&'a SpeedResult),
}

impl EvalPlan {
    /// Checks the plan against the model before anything runs.
    pub fn validate(&self, model: &Model) -> Result<(), String> {
        let max = model.config.max_positions;
        if self.tasks.is_empty() || self.lengths.is_empty() || self.flows.is_empty() {
            return Err("nothing to evaluate: give at least one task, length and flow".into());
        }
        if self.samples == 0 || self.samples > MAX_SAMPLES {
            return Err(format!("--samples must be 1 to {MAX_SAMPLES}"));
        }
        for &l in &self.lengths {
            if l > max {
                return Err(format!(
                    "length {l} tokens is beyond the model's context of {max} tokens"
                ));
            }
            for t in &self.tasks {
                if l < self.reserve(*t).saturating_add(64) {
                    return Err(format!(
                        "length {l} tokens is too short for task {} (it needs room for the answer)",
                        t.name()
                    ));
                }
            }
        }
        if self.prefill_chunk == 0 {
            return Err("the prefill chunk must be at least 1 token".into());
        }
        Ok(())
    }

    /// Tokens of a context kept free of prompt: the answer, and the speed measurement.
    fn reserve(&self, task: Task) -> usize {
        task.max_tokens()
            .saturating_add(self.speed_tokens)
            .saturating_add(1)
    }
}

/// Runs `plan` on `model`, reporting progress as it goes.
pub fn run(
    model: &Model,
    tokenizer: &Tokenizer,
    plan: &EvalPlan,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<EvalResults, String> {
    plan.validate(model)?;
    let cfg = &model.config;
    let geom =
        KvGeometry::new(cfg.heads_kv, cfg.head_dim, plan.page_size).map_err(|e| e.to_string())?;
    let encode = |text: &str| tokenizer.encode(text, true);
    // Every task must leave room for filler at every length before any sample runs.
    for &length in &plan.lengths {
        for &task in &plan.tasks {
            let target = length - plan.reserve(task);
            let fixed = fixed_tokens(task, plan.seed, length, plan.samples, &encode);
            if fixed + MIN_FILLER_TOKENS > target {
                return Err(format!(
                    "task {} at length {length}: its text without filler takes {fixed} of the {target} tokens the prompt may use; give lengths of at least {} tokens",
                    task.name(),
                    fixed + MIN_FILLER_TOKENS + plan.reserve(task)
                ));
            }
        }
    }
    let total = plan.lengths.len() * plan.tasks.len() * plan.samples;
    let mut done = 0;
    let mut results = EvalResults::default();
    for &length in &plan.lengths {
        let pages = geom.pages_for(length) + 4;
        let cache = KvCache::new(geom, plan.kv_dtype, cfg.layers, pages);
        let mut kv = KvState::for_model(cache, FlowRunner::new(plan.flows[0].flow.clone()), cfg);
        let mut current = Some(plan.flows[0].source);
        for (ti, &task) in plan.tasks.iter().enumerate() {
            for index in 0..plan.samples {
                let target = length - plan.reserve(task);
                let s = sample(
                    task,
                    plan.seed,
                    (length, target),
                    (index, plan.samples),
                    &encode,
                )?;
                let t = Instant::now();
                let mut seq = Sequence::default();
                let prefill_settings = Settings::default();
                prefill(
                    model,
                    &mut kv,
                    &mut seq,
                    &s.prompt[..s.prompt.len() - 1],
                    &prefill_settings,
                    plan.prefill_chunk,
                )?;
                done += 1;
                progress(Progress::Prefilled {
                    done,
                    total,
                    task,
                    length,
                    index,
                    prompt_tokens: s.prompt.len(),
                    secs: t.elapsed().as_secs_f64(),
                });
                // Flows switch on the prefilled sequence, which is complete but for its last token.
                for spec in &plan.flows {
                    if current != Some(spec.source) {
                        kv.switch_flow(FlowRunner::new(spec.flow.clone()), &[&seq]);
                        current = Some(spec.source);
                    }
                    let timed = if ti == 0 && index == 0 {
                        plan.speed_tokens
                    } else {
                        0
                    };
                    let (r, speed) = answer(
                        model, tokenizer, &mut kv, &seq, &s, spec, length, plan, timed,
                    )?;
                    progress(Progress::Answered(&r));
                    results.samples.push(r);
                    if let Some(sp) = speed {
                        progress(Progress::Timed(&sp));
                        results.speed.push(sp);
                    }
                }
                kv.cache.free(&mut seq);
            }
        }
    }
    Ok(results)
}

fn prefill(
    model: &Model,
    kv: &mut KvState,
    seq: &mut Sequence,
    tokens: &[u32],
    settings: &Settings,
    chunk: usize,
) -> Result<(), String> {
    let mut state = kv.flow.new_state(model.config.layers);
    // A chunk of one token would be a decode step, through the sparse flow of the last spec.
    for c in prefill_chunks(tokens, chunk) {
        let mut step = [SeqStep {
            seq: &mut *seq,
            state: &mut state,
            settings,
            tokens: c,
        }];
        model.forward(kv, &mut step).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Decodes the last prompt token and then the answer greedily on a fork of `seq`, with `spec`'s
/// flow; then, when `timed > 0`, that many more tokens to time decoding.
#[allow(clippy::too_many_arguments)]
fn answer(
    model: &Model,
    tokenizer: &Tokenizer,
    kv: &mut KvState,
    seq: &Sequence,
    s: &Sample,
    spec: &FlowSpec,
    length: usize,
    plan: &EvalPlan,
    timed: usize,
) -> Result<(SampleResult, Option<SpeedResult>), String> {
    let mut fork = kv.cache.fork(seq);
    let mut state = kv.flow.new_state(model.config.layers);
    let settings = &spec.flow.settings;
    let mut probe =
        FidelityProbe::for_layers(plan.fidelity_layer_stride, &model.config.flow_layers());
    let mut token = *s.prompt.last().expect("samples are never empty");
    let mut out = Vec::new();
    let mut text = String::new();
    let mut step =
        |kv: &mut KvState, fork: &mut Sequence, token: u32, probe: Option<&mut FidelityProbe>| {
            let tokens = [token];
            let mut batch = [SeqStep {
                seq: fork,
                state: &mut state,
                settings,
                tokens: &tokens,
            }];
            let logits = match probe {
                Some(p) => model.forward_observed(kv, &mut batch, p),
                None => model.forward(kv, &mut batch),
            };
            logits.map(|l| argmax(&l[0])).map_err(|e| e.to_string())
        };
    let result = (|| {
        // Once the text holds the answer, one more token shows whether the answer ends there
        // ("68217" is not "682170"): the sample is judged on the text with that token.
        let mut matched = false;
        for i in 0..=s.task.max_tokens() {
            if i == s.task.max_tokens() && !matched {
                break;
            }
            let observe = (i < plan.fidelity_steps).then_some(&mut probe);
            let next = step(kv, &mut fork, token, observe)?;
            if tokenizer.is_eog(next) || plan.stop_tokens.contains(&next) {
                break;
            }
            out.push(next);
            token = next;
            text = tokenizer.decode_with(&out, true);
            if matched || text.trim_start().contains('\n') {
                break;
            }
            matched = exact_match(&text, &s.answers);
        }
        let speed = if timed > 0 {
            let t = Instant::now();
            for _ in 0..timed {
                token = step(kv, &mut fork, token, None)?;
            }
            let secs = t.elapsed().as_secs_f64();
            Some(SpeedResult {
                flow: spec.label.clone(),
                length,
                context_tokens: fork.len,
                tokens: timed,
                tokens_per_s: timed as f64 / secs.max(1e-9),
            })
        } else {
            None
        };
        Ok::<_, String>(speed)
    })();
    kv.cache.free(&mut fork);
    let speed = result?;
    Ok((
        SampleResult {
            task: s.task,
            length,
            index: s.index,
            flow: spec.label.clone(),
            correct: exact_match(&text, &s.answers),
            output: text,
            answers: s.answers.clone(),
            prompt_tokens: s.prompt.len(),
            depth: s.depth,
            fidelity: probe.fidelity,
        },
        speed,
    ))
}
