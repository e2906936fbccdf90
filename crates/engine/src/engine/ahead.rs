//! Decoding ahead of the host. While the device runs a decode step, the host takes in the tokens
//! of the step before it: streams them and sees which requests end. Each token thus reaches its
//! request one step later than the device picked it, and a request that ends on a token no one
//! could foresee (an end-of-generation or stop token, a stop string) has had one more row
//! computed, which is dropped with its pages.
//!
//! A request held to a grammar goes ahead too, where the pass masks on its device: its mask
//! depends on the token in flight, so its pick is queued once that token is in, while the new
//! step runs.
//!
//! The engine goes ahead only while the batch stays as it is. A step that would admit, cancel,
//! preempt, sample on the host, or leave out a request that ended, first takes in the tokens in
//! flight (`settle`) and then runs as usual.

use rayon::prelude::*;
use vortex_model::model::{ForwardError, Next, SeqStep, Wants};

use super::Engine;
use super::picks::{device_pick, pick, scored};
use crate::active::Active;

/// The token of a row whose token is in flight: the pass takes the device's pick instead.
const IN_FLIGHT: [u32; 1] = [0];

impl Engine {
    /// Marks every running request as a row of the pass just queued with its picks.
    pub(super) fn went_ahead(&mut self) {
        for (i, a) in self.running.iter_mut().enumerate() {
            a.ahead = Some(i);
        }
        self.ahead_rows = self.running.len();
        for i in 0..self.running.len() {
            self.cache_prompt_pages(i);
        }
    }

    /// Whether the next step can be queued behind the one in flight: the same requests in the
    /// same order, none cancelled or ending by its length on the token in flight, each asking
    /// for a token the device can pick, no request waiting for a place in the batch, and free
    /// pages for one more token each.
    pub(super) fn continues_ahead(&self) -> bool {
        let same = self.running.len() == self.ahead_rows
            && self
                .running
                .iter()
                .enumerate()
                .all(|(i, a)| a.ahead == Some(i));
        let admits = !self.waiting.is_empty() && self.running.len() < self.cfg.max_running;
        if !same || admits {
            return false;
        }
        let max_positions = self.model.model.config.max_positions;
        let mut pages = 0;
        for a in &self.running {
            let goes_on = !a.cancelled()
                && a.generated + 1 < a.spec.max_tokens
                && a.tokens.len() + 1 < max_positions
                && self.picks_next(a);
            if !goes_on {
                return false;
            }
            pages += self.kv.cache.pages_needed(&a.seq, 1);
        }
        pages <= self.kv.cache.allocator().free_count()
    }

    /// Whether the pass can pick `a`'s token after the one in flight on its device: now, or
    /// (held to a grammar) once that token is in.
    fn picks_next(&self, a: &Active) -> bool {
        if a.spec.logprobs.is_some() && !self.pass.scores_logprobs() {
            false
        } else if a.sampler.is_held() {
            self.pass.masks_ahead() && a.sampler.picks_under_mask_next()
        } else {
            wants_ahead(a).is_some_and(|w| self.pass.picks_ahead(&w))
        }
    }

    /// Queues the next decode step on the tokens in flight, then takes those in while it runs.
    pub(super) fn step_ahead(&mut self) {
        // Picks known before the tokens in flight are in are queued at once; a held request's
        // mask waits for its token.
        let late = self.running.iter().any(|a| a.sampler.is_held());
        let wants: Vec<Wants> = if late {
            Vec::new()
        } else {
            self.running
                .iter()
                .map(|a| wants_ahead(a).expect("checked by continues_ahead"))
                .collect()
        };
        let rows = self.running.len();
        let mut batch: Vec<SeqStep> = self
            .running
            .iter_mut()
            .map(|a| SeqStep {
                seq: &mut a.seq,
                state: &mut a.state,
                settings: &a.spec.settings,
                tokens: &IN_FLIGHT,
            })
            .collect();
        let mut queued = self
            .pass
            .queue_decode(&self.model.model, &mut self.kv, &mut batch, true);
        drop(batch);
        // The last step's tokens were copied back before the new step's work.
        let picked = self.pass.picked();
        if !late {
            queued = queued.and_then(|()| self.pass.pick_ahead(&wants));
        }
        self.take_in(picked);
        if late && queued.is_ok() && self.ahead_rows > 0 {
            let wants = self.wants_in_flight(rows);
            queued = self.pass.pick_ahead(&wants);
        }
        if queued.is_ok() && self.ahead_rows > 0 {
            self.metrics.stepped_ahead();
            // Requests that ended on the tokens taken in have a row in the new step.
            for _ in self.running.len()..rows {
                self.metrics.dropped_row();
            }
        }
        if let Err(e) = queued {
            self.ahead_rows = 0;
            self.pass.discard_ahead();
            let all: Vec<usize> = (0..self.running.len()).collect();
            self.pass_failed(&all, e);
        }
        // A request keeps its row: the new pass has the same rows as the last.
    }

    /// What each of the `rows` rows of the pass in flight asks, its token before taken in:
    /// a request's pick (a held one's under the mask that token leaves), the argmax for a
    /// row whose request has ended (dropped unread).
    fn wants_in_flight(&mut self, rows: usize) -> Vec<Wants> {
        let mut wants = vec![Wants::Argmax; rows];
        let picks: Vec<(usize, Wants)> = self
            .running
            .par_iter_mut()
            .filter_map(|a| Some((a.ahead?, wants_after(a))))
            .collect();
        for (row, w) in picks {
            if let Some(slot) = wants.get_mut(row) {
                *slot = w;
            }
        }
        wants
    }

    /// Takes in the tokens in flight, which no pass will take as its own.
    pub(super) fn settle(&mut self) {
        let picked = self.pass.picked();
        self.take_in(picked);
        for a in &mut self.running {
            a.ahead = None;
        }
        self.ahead_rows = 0;
    }

    /// Gives each request with a row in flight its token from `picked`; ends those that end.
    fn take_in(&mut self, picked: Result<Vec<Next>, ForwardError>) {
        let rows: Vec<usize> = (0..self.running.len())
            .filter(|&i| self.running[i].ahead.is_some())
            .collect();
        let tokens = match picked {
            Ok(t) => t,
            Err(e) => {
                // Picks no request will take (a new step's too) must not wedge the next pass.
                self.ahead_rows = 0;
                self.pass.discard_ahead();
                return self.pass_failed(&rows, e);
            }
        };
        let mut done = Vec::new();
        for i in rows {
            let a = &mut self.running[i];
            let p = match a.ahead.and_then(|r| tokens.get(r)) {
                Some(next) => pick(a, next.clone()),
                None => Err(format!(
                    "forward pass: {} tokens picked for a pass of {} rows",
                    tokens.len(),
                    self.ahead_rows
                )),
            };
            if let Some(end) = self.give(i, p) {
                done.push((i, end));
            }
        }
        self.end(done);
    }
}

/// What a request whose token in flight is in asks of the step already queued: as checked by
/// `picks_next`, a pick its device can make.
fn wants_after(a: &mut Active) -> Wants {
    let pick = device_pick(a).expect("checked by continues_ahead");
    scored(a, pick)
}

/// What a request in flight asks of the next step, if a device may pick it: its sampler has
/// not recorded the token in flight yet.
fn wants_ahead(a: &Active) -> Option<Wants> {
    let pick = if a.sampler.is_plain_greedy() {
        Wants::Argmax
    } else {
        Wants::Draw(a.sampler.device_draw_after(1)?)
    };
    Some(scored(a, pick))
}
