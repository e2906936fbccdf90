//! Prompt log-probabilities (`prompt_logprobs`): the rows of a pass whose next token is a
//! prompt token, and their scores sent to the requests, each position once.

use vortex_model::model::PromptRows;

use super::Engine;
use crate::active::Active;
use crate::request::{Event, TokenLogprob};

impl Engine {
    /// Sends the prompt log-probabilities a pass computed to their requests, each position
    /// once.
    pub(super) fn send_prompt_scores(&mut self, scoring: PromptScoring) {
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
}

/// The prompt rows of a pass whose log-probabilities are asked for (`prompt_logprobs`), and
/// those computed.
pub(super) struct PromptScoring {
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
    pub(super) fn plan(running: &[Active], take: &[usize]) -> PromptScoring {
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

    /// Whether the pass scores no prompt row.
    pub(super) fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    pub(super) fn rows(&self) -> Vec<PromptRows<'_>> {
        let rows = self.seqs.iter().map(|s| PromptRows {
            seq: s.batch,
            next: &s.next,
            top: s.top,
        });
        rows.collect()
    }

    /// The pass's scores, an entry of [`rows`](Self::rows) each.
    pub(super) fn take(&mut self, scores: Vec<Vec<TokenLogprob>>) {
        for (s, scores) in self.seqs.iter_mut().zip(scores) {
            s.scores = scores;
        }
    }
}
