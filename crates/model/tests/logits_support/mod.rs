//! A model's logits for one sequence fed in chunks, on a pool of pages of 4 tokens.

use vortex_flow::runner::FlowRunner;
use vortex_flow::{Geometry, Settings};
use vortex_kv::{KvCache, KvDtype, KvGeometry, Sequence};
use vortex_model::model::{KvState, Model, SeqStep};

/// A pool of 64 pages of 4 tokens for `model`, storing `dtype`, running the built-in flow
/// `flow`: made for the model ([`KvState::for_model`]) or with summaries in every layer.
#[allow(dead_code)] // not every test that shares this file makes its own
pub fn kv_state(model: &Model, flow: &str, dtype: KvDtype, for_model: bool) -> KvState {
    let c = &model.config;
    let g = Geometry {
        heads_q: c.heads_q,
        heads_kv: c.heads_kv,
        head_dim: c.head_dim,
        page_size: 4,
    };
    let flow = FlowRunner::new(vortex_flow::library::load(flow, g).unwrap());
    let geom = KvGeometry::new(c.heads_kv, c.head_dim, 4).unwrap();
    let cache = KvCache::new(geom, dtype, c.layers, 64);
    if for_model {
        KvState::for_model(cache, flow, c)
    } else {
        KvState::new(cache, flow)
    }
}

/// The logits after each chunk of `chunks`, fed in order to a fresh sequence through the dense
/// flow, its keys and values stored as `dtype`.
pub fn logits(model: &Model, chunks: &[&[u32]], dtype: KvDtype) -> Vec<Vec<f32>> {
    let mut kv = kv_state(model, "dense", dtype, false);
    let mut seq = Sequence::default();
    let mut state = kv.flow.new_state(model.config.layers);
    let settings = Settings::default();
    chunks
        .iter()
        .map(|tokens| {
            let mut step = [SeqStep {
                seq: &mut seq,
                state: &mut state,
                settings: &settings,
                tokens,
            }];
            model.forward(&mut kv, &mut step).unwrap().pop().unwrap()
        })
        .collect()
}
