//! A request the engine has accepted: its tokens, pages, flow state, sampler and text stream.

use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;
use vortex_flow::state::RequestState;
use vortex_kv::Sequence;
use vortex_model::generate::StopStream;
use vortex_model::grammar::Constraint;
use vortex_model::sampling::Sampler;
use vortex_model::tokenizer::StreamDecoder;

use crate::request::{Event, RequestSpec};

pub struct Active {
    pub spec: RequestSpec,
    pub events: UnboundedSender<Event>,
    /// The prompt followed by the generated tokens.
    pub tokens: Vec<u32>,
    pub generated: usize,
    /// The pages holding the KV of `tokens[..seq.len]`.
    pub seq: Sequence,
    pub state: RequestState,
    /// The flow's name and its index among the loaded flows.
    pub flow: (String, usize),
    pub sampler: Sampler,
    pub stop: StopStream,
    pub decoder: StreamDecoder,
    /// Chain hashes of the complete prompt pages already in the prefix cache (or, from the
    /// first page whose hash collided with another's, that the cache was offered).
    pub hashes: Vec<u64>,
    /// A page's hash collided: none of its later pages are cached, since their chain would
    /// hang from the other page's entry.
    pub collided: bool,
    pub cached_tokens: usize,
    pub arrival: Instant,
    pub admitted: Option<Instant>,
    pub first_token: Option<Instant>,
    /// Its row in the pass whose picked tokens are in flight, if it has one.
    pub ahead: Option<usize>,
    /// Prompt tokens whose log-probability has been sent (the second on; `prompt_logprobs`).
    pub prompt_scored: usize,
}

impl Active {
    /// A request whose generation `end` tokens would end (for `min_tokens`), its tokens held
    /// to `constraint` if it has one.
    pub fn new(
        spec: RequestSpec,
        events: UnboundedSender<Event>,
        end: Vec<u32>,
        constraint: Option<Constraint>,
    ) -> Self {
        let mut sampler =
            Sampler::new(spec.sampling.clone(), &spec.prompt).with_min_tokens(end, spec.min_tokens);
        if let Some(c) = constraint {
            sampler = sampler.constrained(c);
        }
        let stop = StopStream::new(&spec.stop).keeping_stop(spec.keep_stop);
        let decoder = StreamDecoder::new(spec.skip_special);
        Self {
            tokens: spec.prompt.clone(),
            spec,
            events,
            generated: 0,
            seq: Sequence::default(),
            state: RequestState::default(),
            flow: (String::new(), 0),
            sampler,
            stop,
            decoder,
            hashes: Vec::new(),
            collided: false,
            cached_tokens: 0,
            arrival: Instant::now(),
            admitted: None,
            first_token: None,
            ahead: None,
            prompt_scored: 0,
        }
    }

    /// Streams `piece` of the generated text through the stop strings, which are looked for
    /// from token `min_tokens + 1` on (as vLLM); returns whether one ended the text.
    pub fn stream_text(&mut self, piece: &str, on_text: &mut dyn FnMut(&str)) -> bool {
        if self.generated <= self.spec.min_tokens {
            self.stop.push_unchecked(piece, on_text);
            false
        } else {
            self.stop.push(piece, on_text)
        }
    }

    /// Tokens whose KV is not computed yet.
    pub fn pending(&self) -> usize {
        self.tokens.len() - self.seq.len
    }

    /// Tokens the planner may give this request in one step. A prompt's tokens go in chunks;
    /// tokens it generated, recomputed after a preemption, go one a step as they first went,
    /// through the flow's decode, so that their KV comes out as it was.
    pub fn plannable(&self) -> usize {
        let prompt = self.spec.prompt.len();
        if self.seq.len < prompt {
            prompt - self.seq.len
        } else {
            self.pending().min(1)
        }
    }

    /// Whether it generates at all: one of `max_tokens` 0 asks for its prompt alone (scored
    /// where it asks for `prompt_logprobs`) and ends once the prompt is in.
    pub fn generates(&self) -> bool {
        self.spec.max_tokens > 0
    }

    /// The tokens it holds at most once its next step is in: a token more than now, where it
    /// generates.
    pub fn tokens_after_step(&self) -> usize {
        self.tokens.len() + usize::from(self.generates())
    }

    pub fn cancelled(&self) -> bool {
        self.events.is_closed()
    }
}
