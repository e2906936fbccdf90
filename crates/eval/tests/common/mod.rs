//! The tiny random byte-level chat model the model crate provides for tests, and a KV cache
//! for it running a built-in flow.

use vortex_flow::library::load;
use vortex_flow::runner::FlowRunner;
use vortex_flow::{Geometry, Settings};
use vortex_kv::{KvCache, KvDtype, KvGeometry};
use vortex_model::model::{KvState, Model};
use vortex_model::tokenizer::Tokenizer;

pub fn tiny_model(seed: u64) -> Model {
    vortex_model::random::tiny(seed).model
}

/// One token per byte.
#[allow(dead_code)] // not every test file uses it
pub fn byte_tokenizer() -> Tokenizer {
    vortex_model::random::tiny(0).tokenizer
}

/// A bf16 cache of `pages` pages of `page` tokens for `model`, running the built-in `flow` (at
/// `budget` pages where given), and the flow's settings.
#[allow(dead_code)] // not every test file uses it
pub fn flow_cache(
    model: &Model,
    flow: &str,
    budget: Option<usize>,
    page: usize,
    pages: usize,
) -> (KvState, Settings) {
    let cfg = &model.config;
    let g = Geometry {
        heads_q: cfg.heads_q,
        heads_kv: cfg.heads_kv,
        head_dim: cfg.head_dim,
        page_size: page,
    };
    let mut f = load(flow, g).unwrap();
    if let Some(b) = budget {
        f.settings.budget = Some(b);
        f.settings.budget_ratio = None;
    }
    let settings = f.settings.clone();
    let geom = KvGeometry::new(cfg.heads_kv, cfg.head_dim, page).unwrap();
    let cache = KvCache::new(geom, KvDtype::Bf16, cfg.layers, pages);
    (KvState::new(cache, FlowRunner::new(f)), settings)
}
