//! How requests end: finished (the rest of their text, usage and times sent), or failed (a
//! pass that failed, a lost device), their pages given back either way.

use std::time::Instant;

use vortex_model::model::ForwardError;

use super::Engine;
use crate::active::Active;
use crate::metrics::RequestTimes;
use crate::request::{Event, FinishReason, Usage};

impl Engine {
    /// Ends the running requests `done` (in ascending order): finished or failed.
    pub(super) fn end(&mut self, done: Vec<(usize, Result<FinishReason, String>)>) {
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
    pub(super) fn pass_failed(&mut self, stepped: &[usize], e: ForwardError) {
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
    pub(super) fn fail(&mut self, mut a: Active, why: String) {
        self.kv.cache.free(&mut a.seq);
        let _ = a.events.send(Event::Failed(why));
        self.metrics.generated(a.generated);
        self.metrics.finished("error", None);
    }

    pub(super) fn finish(&mut self, mut a: Active, reason: FinishReason) {
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
}
