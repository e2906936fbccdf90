//! Attention fidelity: a full budget gives recall 1 and error 0; leaving out a page that holds
//! most of the attention drops recall; the model's decode hook shows the real selected pages.

mod common;

use vortex_eval::fidelity::{FidelityProbe, row_fidelity};
use vortex_eval::rng::Rng;
use vortex_kernels::attention::decode_attention;
use vortex_kv::{KvCache, KvDtype, KvGeometry, PageTable, Sequence};
use vortex_model::model::SeqStep;

const D: usize = 16;
const P: usize = 16;

/// A one-head layer of 10 pages with random keys, and a query; page 4's keys point along the
/// query so that it holds most of the attention.
fn planted() -> (KvCache, Sequence, Vec<f32>) {
    let geom = KvGeometry::new(1, D, P).unwrap();
    let mut cache = KvCache::new(geom, KvDtype::F32, 1, 16);
    let mut seq = Sequence::default();
    let tokens = 9 * P + 5;
    let slots = cache.append(&mut seq, tokens).unwrap();
    let mut r = Rng::new(3);
    let mut rand = |n: usize| -> Vec<f32> { (0..n).map(|_| r.unit() as f32 * 2.0 - 1.0).collect() };
    let q = rand(D);
    for (i, s) in slots.iter().enumerate() {
        let k: Vec<f32> = if i / P == 4 {
            q.iter().map(|x| 3.0 * x).collect()
        } else {
            rand(D)
        };
        let v = rand(D);
        cache
            .layer_mut(0)
            .write_token(s.page, s.offset, &k, &v)
            .unwrap();
    }
    (cache, seq, q)
}

fn run(
    cache: &KvCache,
    seq: &Sequence,
    q: &[f32],
    pages: &[u32],
) -> vortex_eval::fidelity::RowFidelity {
    let mut table = PageTable::new(1);
    table.push_row(pages, seq.last_page_len(P));
    let scale = 1.0 / (D as f32).sqrt();
    let mut out = vec![0.0; D];
    decode_attention(cache.layer(0), &table, q, 1, scale, &mut out).unwrap();
    row_fidelity(cache.layer(0), seq, 0, pages, q, &out, scale)
}

#[test]
fn full_budget_is_exact() {
    let (cache, seq, q) = planted();
    let f = run(&cache, &seq, &q, &seq.pages);
    assert!((f.mass_recall - 1.0).abs() < 1e-9, "{f:?}");
    assert_eq!(f.topk_recall, 1.0);
    assert!(f.rel_error < 1e-5, "{f:?}");
}

#[test]
fn leaving_out_the_planted_page_drops_recall() {
    let (cache, seq, q) = planted();
    // Everything but the planted page.
    let without: Vec<u32> = seq
        .pages
        .iter()
        .copied()
        .filter(|&p| p != seq.pages[4])
        .collect();
    let f = run(&cache, &seq, &q, &without);
    assert!(
        f.mass_recall < 0.5,
        "the planted page holds most of the mass: {f:?}"
    );
    assert!(f.topk_recall < 1.0, "{f:?}");
    assert!(f.rel_error > 0.2, "{f:?}");
    // Keeping it and leaving out another page instead costs little.
    let other: Vec<u32> = seq
        .pages
        .iter()
        .copied()
        .filter(|&p| p != seq.pages[6])
        .collect();
    let g = run(&cache, &seq, &q, &other);
    assert!(g.mass_recall > 0.9 && g.mass_recall < 1.0, "{g:?}");
    assert!(g.mass_recall > f.mass_recall + 0.4);
}

/// Prefills a random prompt on the tiny model, then decodes one token with `flow` at `budget`
/// pages, measuring fidelity in every layer through the model's decode hook.
fn model_fidelity(flow: &str, budget: Option<usize>) -> vortex_eval::fidelity::Fidelity {
    let model = common::tiny_model(7);
    let cfg = &model.config;
    let (mut kv, settings) = common::flow_cache(&model, flow, budget, P, 40);
    let mut seq = Sequence::default();
    let mut state = kv.flow.new_state(cfg.layers);
    let mut r = Rng::new(11);
    let prompt: Vec<u32> = (0..400).map(|_| r.below(256) as u32).collect();
    let mut step = [SeqStep {
        seq: &mut seq,
        state: &mut state,
        settings: &settings,
        tokens: &prompt,
    }];
    model.forward(&mut kv, &mut step).unwrap();
    let mut probe = FidelityProbe::new(1);
    let mut step = [SeqStep {
        seq: &mut seq,
        state: &mut state,
        settings: &settings,
        tokens: &[65],
    }];
    model
        .forward_observed(&mut kv, &mut step, &mut probe)
        .unwrap();
    probe.fidelity
}

#[test]
fn model_hook_dense_is_exact_and_sparse_is_not() {
    let dense = model_fidelity("dense", None);
    assert_eq!(dense.rows, 2 * 2, "every layer and KV head is measured");
    assert!(
        (dense.mass_recall - 1.0).abs() < 1e-9 && dense.topk_recall == 1.0,
        "{dense:?}"
    );
    assert!(dense.rel_error < 1e-4, "{dense:?}");
    // A full budget through a sparse flow is dense too.
    let full = model_fidelity("block_topk", Some(1000));
    assert!(
        (full.mass_recall - 1.0).abs() < 1e-9 && full.rel_error < 1e-4,
        "{full:?}"
    );
    // Three of 26 pages.
    let sparse = model_fidelity("streaming", Some(3));
    assert!(sparse.mass_recall < 0.9, "{sparse:?}");
    assert!(sparse.rel_error > 1e-3, "{sparse:?}");
}

/// A probe over the layers that run the flow measures every stride-th of them, not of all
/// layers (a model whose sliding-window layers never run it).
#[test]
fn a_probe_over_flow_layers_strides_through_them() {
    use vortex_model::model::DecodeObserver;
    let probe = FidelityProbe::for_layers(2, &[5, 11, 17]);
    let wanted: Vec<usize> = (0..18).filter(|&l| probe.wants(l)).collect();
    assert_eq!(wanted, [5, 17]);
    let every = FidelityProbe::new(3);
    assert!((0..7).filter(|&l| every.wants(l)).eq([0, 3, 6]));
}
