//! A request's next token: what it asks a pass for, the token sampled from its logits or
//! taken from the device's pick, and that token streamed.

use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;
use vortex_model::loader::LoadedModel;
use vortex_model::model::{Next, Wants};

use super::Engine;
use crate::active::Active;
use crate::request::{Event, FinishReason, TokenLogprob, token_logprob};

impl Engine {
    /// Takes in a pass's results for the running requests `stepped` (in ascending order):
    /// completed prompt pages go to the prefix cache, requests whose prompt is in get their
    /// token, and those that end are ended.
    pub(super) fn take_pass(&mut self, stepped: &[usize], next: Vec<Next>) {
        for &i in stepped {
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
                None if a.pending() == 0 && !a.generates() => Some(Ok(FinishReason::Length)),
                None => None,
            };
            if let Some(end) = end {
                done.push((i, end));
            }
        }
        self.end(done);
    }

    /// Streams request `i`'s picked token; returns how it ends, if it does.
    pub(super) fn give(
        &mut self,
        i: usize,
        p: Result<Pick, String>,
    ) -> Option<Result<FinishReason, String>> {
        match p {
            Ok(p) => deliver(&self.model, &mut self.running[i], p).map(Ok),
            Err(why) => Some(Err(why)),
        }
    }
}

/// What a pass gives back for a request that computes `n` of its pending tokens: nothing
/// before its prompt is in or where it generates nothing, else its token picked where the
/// logits are (with its log-probabilities there, where the pass `scores` them), or its logits.
pub(super) fn wants_of(a: &mut Active, n: usize, scores: bool) -> Wants {
    if a.pending() > n || !a.generates() {
        return Wants::Nothing;
    }
    if a.spec.logprobs.is_some() && !scores {
        return Wants::Logits;
    }
    device_pick(a).map_or(Wants::Logits, |w| scored(a, w))
}

/// `pick`, with the log-probabilities `a` asks for.
pub(super) fn scored(a: &Active, pick: Wants) -> Wants {
    match a.spec.logprobs {
        Some(k) => Wants::Scored(Box::new(pick), k),
        None => pick,
    }
}

/// The pick a device can make for `a`, if nothing the host applies changes its logits.
pub(super) fn device_pick(a: &mut Active) -> Option<Wants> {
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
pub(super) struct Pick {
    token: u32,
    logprob: Option<TokenLogprob>,
}

/// The next token of `a`: sampled from the logits, or the one the pass chose as asked.
pub(super) fn pick(a: &mut Active, next: Next) -> Result<Pick, String> {
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
                // Ranks are given of prompt tokens only: a pick made on a device has none.
                logprob: raw.zip(a.spec.logprobs).map(|(raw, k)| TokenLogprob {
                    rank: None,
                    ..token_logprob(&raw, token, k)
                }),
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
                rank: None,
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
pub(super) fn take_device_pick(
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
pub(super) fn picks_on_device(a: &Active) -> bool {
    a.sampler.is_plain_greedy() || a.sampler.device_draw().is_some() || a.sampler.picks_under_mask()
}

/// Streams a picked token. Returns why the request ends, if it does.
pub(super) fn deliver(model: &LoadedModel, a: &mut Active, pick: Pick) -> Option<FinishReason> {
    let token = pick.token;
    if a.first_token.is_none() {
        a.first_token = Some(Instant::now());
    }
    let tok = &model.tokenizer;
    let eog = tok.is_eog(token) || model.stop_tokens.contains(&token);
    // A grammar offers an end token only where its reply may end: `ignore_eos` cannot write
    // past it (the end token's text would break the JSON).
    let ends = eog && (!a.spec.ignore_eos || a.spec.grammar.is_some());
    // A listed stop token ends the text; `keep_stop` writes it first, as vLLM's
    // `include_stop_str_in_output` does.
    let listed = a.spec.stop_tokens.contains(&token);
    if ends || (listed && !a.spec.keep_stop) {
        return Some(FinishReason::Stop);
    }
    a.tokens.push(token);
    a.generated += 1;
    let mut piece = a.decoder.push(tok, token);
    if listed {
        piece.push_str(&a.decoder.finish());
    }
    let mut text = String::new();
    let hit_stop = a.stream_text(&piece, &mut |t| text.push_str(t));
    let logprobs: Vec<TokenLogprob> = pick.logprob.into_iter().collect();
    let _ = a.events.send(Event::Delta {
        text,
        tokens: vec![token],
        logprobs,
        prompt: vec![],
    });
    if listed || hit_stop || a.sampler.grammar_finished() {
        Some(FinishReason::Stop)
    } else if a.generated >= a.spec.max_tokens || a.tokens.len() >= model.model.config.max_positions
    {
        Some(FinishReason::Length)
    } else {
        None
    }
}
