//! What a client asks of the engine, and what the engine sends back while it runs.

use std::sync::Arc;

use vortex_flow::{Flow, Settings};
use vortex_model::grammar::Grammar;
pub use vortex_model::logprob::{TokenLogprob, token_logprob};
use vortex_model::sampling::SamplingParams;

/// One generation request, already tokenized and validated.
#[derive(Debug, Clone)]
pub struct RequestSpec {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    /// 0 generates nothing: the prompt is computed (and scored, with `prompt_logprobs`) and
    /// the request finishes with [`FinishReason::Length`] without a token sampled.
    pub max_tokens: usize,
    /// No end token, stop token or stop string ends the generation before this many tokens
    /// (vLLM's `min_tokens`).
    pub min_tokens: usize,
    /// Generation stops before the first occurrence of any of these strings.
    pub stop: Vec<String>,
    /// The stop string that ends generation stays at the end of the text (vLLM's
    /// `include_stop_str_in_output`).
    pub keep_stop: bool,
    /// Generation stops at any of these tokens (besides the model's end-of-generation tokens).
    pub stop_tokens: Vec<u32>,
    /// Control tokens (`<|im_end|>`, ...) are left out of the text (vLLM's
    /// `skip_special_tokens`, on by default there too).
    pub skip_special: bool,
    pub ignore_eos: bool,
    /// The flow this request runs: its name and, when the engine has not loaded it yet, the
    /// checked flow to load. `None` runs the engine's default flow.
    pub flow: Option<FlowChoice>,
    pub settings: Settings,
    /// Report each token's log-probability and this many most likely alternatives.
    pub logprobs: Option<usize>,
    /// Report each prompt token's log-probability (the second on) and this many most likely
    /// alternatives (OpenAI's `echo` with `logprobs`). Such a request computes its whole
    /// prompt: it takes nothing from the prefix cache.
    pub prompt_logprobs: Option<usize>,
    /// The grammar the reply must follow (JSON, a JSON Schema's): its tokens are then sampled
    /// on the host, one step at a time.
    pub grammar: Option<Arc<Grammar>>,
}

#[derive(Debug, Clone)]
pub struct FlowChoice {
    pub name: String,
    pub flow: Flow,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string or token.
    Stop,
    /// `max_tokens` or the model's context reached.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached_tokens: usize,
}

/// What the engine sends a request's client, in order: deltas, then one `Finished` or `Failed`.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Text that became final this step and the tokens sampled (the text of a token can arrive
    /// later than the token, when it might begin a stop string or a multi-byte character).
    Delta {
        text: String,
        tokens: Vec<u32>,
        logprobs: Vec<TokenLogprob>,
        /// Log-probabilities of prompt tokens computed this step, in order from the prompt's
        /// second token (a request with `prompt_logprobs`; they all come before any token).
        prompt: Vec<TokenLogprob>,
    },
    Finished {
        reason: FinishReason,
        usage: Usage,
        /// The flow that ran.
        flow: String,
    },
    /// The request ran and could not finish (its pages are given back).
    Failed(String),
    /// The request was not run: it asks for what this engine cannot do (a request the server
    /// should have refused, or a flow the device cannot load). Nothing was generated.
    Refused(String),
}
