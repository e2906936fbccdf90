//! Generating text for one request: chunked prefill, then decode steps with the flow's sparse
//! attention, sampling, stop conditions and streaming.

use std::time::Instant;

use vortex_flow::Settings;
use vortex_kv::Sequence;

use crate::model::{ForwardError, KvState, Model, SeqStep};
use crate::sampling::{Sampler, SamplingParams};
use crate::tokenizer::Tokenizer;

/// What to generate and when to stop.
#[derive(Debug, Clone)]
pub struct GenerateParams {
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    /// Generation stops before the first occurrence of any of these strings.
    pub stop: Vec<String>,
    /// Generation stops at any of these tokens (besides the model's end-of-generation tokens).
    pub stop_tokens: Vec<u32>,
    pub ignore_eos: bool,
    /// The flow's settings for this request.
    pub settings: Settings,
    /// Prompt tokens per prefill forward pass.
    pub prefill_chunk: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string or token.
    Stop,
    /// `max_tokens` reached.
    Length,
}

#[derive(Debug, Clone)]
pub struct GenerateOutput {
    pub tokens: Vec<u32>,
    pub text: String,
    pub finish: FinishReason,
    pub prompt_tokens: usize,
    pub prefill_secs: f64,
    pub decode_secs: f64,
    /// KV pages the request held at its longest.
    pub pages_used: usize,
}

/// Prefills `prompt`, then samples up to `max_tokens` tokens, calling `on_text` with each piece
/// of text as soon as it is final. The request's pages are freed before returning.
pub fn generate(
    model: &Model,
    tokenizer: &Tokenizer,
    kv: &mut KvState,
    prompt: &[u32],
    params: &GenerateParams,
    on_text: &mut dyn FnMut(&str),
) -> Result<GenerateOutput, ForwardError> {
    if prompt.is_empty() {
        return Err(ForwardError::Empty);
    }
    let total = prompt.len().saturating_add(params.max_tokens);
    if total > model.config.max_positions {
        return Err(ForwardError::TooLong {
            tokens: total,
            max: model.config.max_positions,
        });
    }
    let mut seq = Sequence::default();
    let mut state = kv.flow.new_state(model.config.layers);
    let result = generate_with(
        &mut |tokens| {
            let mut step = [SeqStep {
                seq: &mut seq,
                state: &mut state,
                settings: &params.settings,
                tokens,
            }];
            Ok(model.forward(kv, &mut step)?.pop().unwrap_or_default())
        },
        tokenizer,
        prompt,
        params,
        on_text,
    );
    let pages_used = seq.pages.len();
    kv.cache.free(&mut seq);
    result.map(|mut out| {
        out.pages_used = pages_used;
        out
    })
}

/// A forward pass over one request: appends tokens, returns the last token's logits.
pub type ForwardFn<'a> = dyn FnMut(&[u32]) -> Result<Vec<f32>, ForwardError> + 'a;

/// `prompt` in prefill passes of at most `chunk` tokens, except that a last pass of one token
/// joins the one before: a pass of one token is a decode step, which attends through the flow.
pub fn prefill_chunks(prompt: &[u32], chunk: usize) -> Vec<&[u32]> {
    let chunk = chunk.max(2);
    let mut out: Vec<&[u32]> = prompt.chunks(chunk).collect();
    if out.len() > 1 && out[out.len() - 1].len() == 1 {
        let start = (out.len() - 2) * chunk;
        out.truncate(out.len() - 2);
        out.push(&prompt[start..]);
    }
    out
}

/// The generation loop over any forward pass: `forward` appends a prompt chunk or one sampled
/// token to the request and returns the logits of its last token.
pub fn generate_with(
    forward: &mut ForwardFn,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    params: &GenerateParams,
    on_text: &mut dyn FnMut(&str),
) -> Result<GenerateOutput, ForwardError> {
    if prompt.is_empty() {
        return Err(ForwardError::Empty);
    }
    let start = Instant::now();
    let mut logits = Vec::new();
    for chunk in prefill_chunks(prompt, params.prefill_chunk) {
        logits = forward(chunk)?;
    }
    let prefill_secs = start.elapsed().as_secs_f64();
    let decode_start = Instant::now();
    let mut sampler = Sampler::new(params.sampling.clone(), prompt);
    let mut stream = StopStream::new(&params.stop);
    let mut decoder = tokenizer.stream_decoder(true);
    let mut tokens = Vec::new();
    let mut finish = FinishReason::Length;
    while tokens.len() < params.max_tokens {
        let token = sampler.sample(&mut logits);
        let is_stop =
            (!params.ignore_eos && tokenizer.is_eog(token)) || params.stop_tokens.contains(&token);
        if is_stop {
            finish = FinishReason::Stop;
            break;
        }
        tokens.push(token);
        let piece = decoder.push(tokenizer, token);
        if stream.push(&piece, on_text) {
            finish = FinishReason::Stop;
            break;
        }
        if tokens.len() == params.max_tokens {
            break;
        }
        logits = forward(std::slice::from_ref(&token))?;
    }
    if finish == FinishReason::Length {
        let rest = decoder.finish();
        stream.push(&rest, on_text);
    }
    stream.flush(on_text);
    Ok(GenerateOutput {
        tokens,
        text: stream.text,
        finish,
        prompt_tokens: prompt.len(),
        prefill_secs,
        decode_secs: decode_start.elapsed().as_secs_f64(),
        pages_used: 0,
    })
}

/// Streams text while watching for stop strings: text that could still become the start of a
/// stop string is held back until it is decided.
pub struct StopStream {
    stops: Vec<String>,
    /// Everything produced so far (up to a stop string).
    pub text: String,
    emitted: usize,
    /// The stop string found ends the text instead of being cut off.
    keep_stop: bool,
    /// The end of the text added unchecked: a stop string found must end after it.
    checked_from: usize,
}

impl StopStream {
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.to_vec(),
            text: String::new(),
            emitted: 0,
            keep_stop: false,
            checked_from: 0,
        }
    }

    /// With `keep`, the stop string found stays at the end of the text.
    pub fn keeping_stop(mut self, keep: bool) -> Self {
        self.keep_stop = keep;
        self
    }

    /// Adds a piece; returns true when a stop string was found (the text ends before it, or
    /// with it when kept). The one that completes first counts (as appending the text a
    /// character at a time would find), of two completing together the first listed.
    pub fn push(&mut self, piece: &str, on_text: &mut dyn FnMut(&str)) -> bool {
        self.text.push_str(piece);
        let hit = self
            .stops
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_empty())
            .filter_map(|(k, s)| {
                // Text before `emitted` was searched; a match must end in checked text.
                let mut from = self
                    .emitted
                    .max((self.checked_from + 1).saturating_sub(s.len()));
                while !self.text.is_char_boundary(from) {
                    from += 1;
                }
                self.text[from..]
                    .find(s.as_str())
                    .map(|i| (from + i + s.len(), k, from + i))
            })
            .min();
        if let Some((end, _, at)) = hit {
            self.text.truncate(if self.keep_stop { end } else { at });
            self.flush(on_text);
            return true;
        }
        self.emit_decided(on_text);
        false
    }

    /// Adds a piece without looking for stop strings in it (vLLM's `min_tokens` not reached
    /// yet). Its end is held back as [`push`](Self::push) holds it: a stop string may begin
    /// there and end in the next piece.
    pub fn push_unchecked(&mut self, piece: &str, on_text: &mut dyn FnMut(&str)) {
        self.text.push_str(piece);
        self.checked_from = self.text.len();
        self.emit_decided(on_text);
    }

    /// Emits the text no stop string can begin in any more.
    fn emit_decided(&mut self, on_text: &mut dyn FnMut(&str)) {
        let hold = self
            .stops
            .iter()
            .map(|s| s.len().saturating_sub(1))
            .max()
            .unwrap_or(0);
        let mut safe = self.text.len().saturating_sub(hold).max(self.emitted);
        while !self.text.is_char_boundary(safe) {
            safe -= 1;
        }
        if safe > self.emitted {
            on_text(&self.text[self.emitted..safe]);
            self.emitted = safe;
        }
    }

    /// Emits whatever is held back.
    pub fn flush(&mut self, on_text: &mut dyn FnMut(&str)) {
        if self.text.len() > self.emitted {
            on_text(&self.text[self.emitted..]);
            self.emitted = self.text.len();
        }
    }
}
