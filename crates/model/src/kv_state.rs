//! The attention memory of a running model: the paged KV cache, and each loaded flow with its
//! per-page summaries of the layers where it selects.

use vortex_flow::runner::FlowRunner;
use vortex_kv::{KvCache, PageFields, PageId, Sequence};

use crate::config::ModelConfig;

/// The paged KV cache, and the flow with its per-page summaries (a set a layer, of no pages in
/// layers where no flow selects). More flows can run side by side (`others`); a request picks
/// one through its state's `flow` index (0 is `flow`, `i` is `others[i - 1]`).
pub struct KvState {
    pub cache: KvCache,
    pub flow: FlowRunner,
    pub fields: Vec<PageFields>,
    pub others: Vec<FlowSlot>,
    /// The layers whose pages a flow selects; the others' summaries hold no pages.
    selecting: Vec<bool>,
}

/// A flow loaded beside the default one, with its page summaries (as [`KvState::fields`]).
pub struct FlowSlot {
    pub runner: FlowRunner,
    pub fields: Vec<PageFields>,
}

impl KvState {
    /// `cache` with `flow`'s summaries in every layer.
    pub fn new(cache: KvCache, flow: FlowRunner) -> Self {
        let selecting = vec![true; cache.num_layers()];
        Self::selecting(cache, flow, selecting)
    }

    /// `cache` for a model of `config`: its sliding-window layers attend to their window and
    /// never select pages, so they keep no summaries.
    pub fn for_model(cache: KvCache, flow: FlowRunner, config: &ModelConfig) -> Self {
        let selecting = (0..cache.num_layers())
            .map(|l| config.window(l).is_none())
            .collect();
        Self::selecting(cache, flow, selecting)
    }

    fn selecting(cache: KvCache, flow: FlowRunner, selecting: Vec<bool>) -> Self {
        let mut kv = Self {
            cache,
            flow,
            fields: Vec::new(),
            others: Vec::new(),
            selecting,
        };
        kv.fields = kv.empty_fields(&kv.flow);
        kv
    }

    /// Whether a flow selects pages in `layer` (and so keeps its summaries).
    pub fn selects_in(&self, layer: usize) -> bool {
        self.selecting.get(layer).copied().unwrap_or(false)
    }

    /// Runs `flow` from now on, summarising the complete pages of `seqs` for it.
    pub fn switch_flow(&mut self, flow: FlowRunner, seqs: &[&Sequence]) {
        self.fields = self.summarize_all(&flow, seqs);
        self.flow = flow;
    }

    /// Loads `flow` beside the others, summarising the complete pages of `seqs` (every
    /// sequence that may run it); returns its index for [`RequestState::flow`].
    ///
    /// [`RequestState::flow`]: vortex_flow::state::RequestState::flow
    pub fn add_flow(&mut self, flow: FlowRunner, seqs: &[&Sequence]) -> usize {
        let fields = self.summarize_all(&flow, seqs);
        self.others.push(FlowSlot {
            runner: flow,
            fields,
        });
        self.others.len()
    }

    /// The flow at `index` and its summaries.
    pub fn flow_at(&self, index: usize) -> Option<(&FlowRunner, &[PageFields])> {
        match index {
            0 => Some((&self.flow, &self.fields)),
            i => self.others.get(i - 1).map(|s| (&s.runner, &s.fields[..])),
        }
    }

    /// Loaded flows: the default first.
    pub fn num_flows(&self) -> usize {
        1 + self.others.len()
    }

    /// Bytes of the loaded flows' summaries, every layer.
    pub fn summary_bytes(&self) -> usize {
        let of = |fields: &[PageFields]| fields.iter().map(PageFields::bytes).sum::<usize>();
        of(&self.fields) + self.others.iter().map(|o| of(&o.fields)).sum::<usize>()
    }

    /// `runner`'s summaries, zero, for every layer (of no pages where no flow selects).
    fn empty_fields(&self, runner: &FlowRunner) -> Vec<PageFields> {
        let pages = self.cache.allocator().total();
        (0..self.cache.num_layers())
            .map(|l| runner.new_fields(if self.selects_in(l) { pages } else { 0 }))
            .collect()
    }

    /// `runner`'s summaries of the complete pages of `seqs`.
    fn summarize_all(&self, runner: &FlowRunner, seqs: &[&Sequence]) -> Vec<PageFields> {
        let p = self.cache.geometry().page_size;
        let complete: Vec<PageId> = seqs
            .iter()
            .flat_map(|s| s.pages[..s.complete_pages(p)].iter().copied())
            .collect();
        let mut fields = self.empty_fields(runner);
        for (l, f) in fields.iter_mut().enumerate() {
            if self.selects_in(l) {
                runner.summarize(self.cache.layer(l), f, &complete);
            }
        }
        fields
    }
}
