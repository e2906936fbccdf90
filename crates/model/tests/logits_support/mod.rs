//! A model's logits for one sequence fed in chunks, through the dense flow on a pool of pages
//! of 4 tokens.

use vortex_flow::runner::FlowRunner;
use vortex_flow::{Geometry, Settings};
use vortex_kv::{KvCache, KvDtype, KvGeometry, Sequence};
use vortex_model::model::{KvState, Model, SeqStep};

/// The logits after each chunk of `chunks`, fed in order to a fresh sequence whose keys and
/// values are stored as `dtype`.
pub fn logits(model: &Model, chunks: &[&[u32]], dtype: KvDtype) -> Vec<Vec<f32>> {
    let c = &model.config;
    let g = Geometry {
        heads_q: c.heads_q,
        heads_kv: c.heads_kv,
        head_dim: c.head_dim,
        page_size: 4,
    };
    let flow = vortex_flow::library::load("dense", g).unwrap();
    let geom = KvGeometry::new(c.heads_kv, c.head_dim, 4).unwrap();
    let mut kv = KvState::new(
        KvCache::new(geom, dtype, c.layers, 64),
        FlowRunner::new(flow),
    );
    let mut seq = Sequence::default();
    let mut state = kv.flow.new_state(c.layers);
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
