//! Who is in the batch: waiting requests admitted in arrival order while their pages fit,
//! cancelled ones dropped, and, when a step's pages run short, cached pages evicted and then
//! the newest requests preempted.

use std::time::Instant;

use vortex_kv::Sequence;

use super::Engine;
use crate::active::Active;
use crate::request::Event;
use crate::scheduler::plan;

impl Engine {
    pub(super) fn drop_cancelled(&mut self) {
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
    pub(super) fn admit(&mut self) {
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

    /// Plans this step's tokens and frees pages until they fit: first least recently used
    /// prefix-cache pages, then whole requests, newest first (they are recomputed later).
    pub(super) fn make_room(&mut self) -> Vec<usize> {
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
}
