//! Timing of the index phase alone (not a test of correctness; run with --ignored).

use std::time::Instant;

use vortex_flow::Geometry;
use vortex_flow::library::load;
use vortex_flow::runner::{FlowRunner, StepSeq};
use vortex_kv::{KvCache, KvDtype, KvGeometry, Sequence};

#[test]
#[ignore]
fn index_phase_timing() {
    let g = Geometry {
        heads_q: 32,
        heads_kv: 8,
        head_dim: 128,
        page_size: 16,
    };
    let ctx = 32768;
    let geom = KvGeometry::new(8, 128, 16).unwrap();
    let mut cache = KvCache::new(geom, KvDtype::F32, 1, ctx / 16);
    let mut seq = Sequence::default();
    let slots = cache.append(&mut seq, ctx).unwrap();
    let k: Vec<f32> = (0..8 * 128).map(|i| (i as f32 * 0.37).sin()).collect();
    for s in slots {
        cache
            .layer_mut(0)
            .write_token(s.page, s.offset, &k, &k)
            .unwrap();
    }
    let q: Vec<f32> = (0..32 * 128).map(|i| (i as f32 * 0.11).cos()).collect();
    for name in std::env::var("FLOWS")
        .unwrap_or("block_topk,quest,double_sparse,h2o,lsh".into())
        .split(',')
    {
        let mut flow = load(name, g).unwrap();
        flow.settings.budget = Some(128);
        let runner = FlowRunner::new(flow);
        let mut fields = runner.new_fields(cache.allocator().total());
        runner.summarize(cache.layer(0), &mut fields, &seq.pages);
        let mut state = runner.new_state(1);
        let settings = runner.flow.settings.clone();
        let iters: usize = std::env::var("ITERS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(50);
        let flush = std::env::var("FLUSH").is_ok();
        let mut junk = vec![1.0f32; if flush { 32 << 20 } else { 0 }];
        let (mut total, mut selecting) = (0.0, 0.0);
        let mut table = vortex_kv::PageTable::new(8);
        for _ in 0..iters {
            if flush {
                junk.iter_mut().for_each(|x| *x += 1.0);
                std::hint::black_box(&junk);
            }
            let t = Instant::now();
            let mut batch = [StepSeq {
                seq: &seq,
                settings: &settings,
                state: Some(&mut state.layers[0]),
            }];
            let scores = runner.scores(0, &fields, &q, &mut batch);
            let scored = Instant::now();
            let stats = runner.table_from_scores(0, &batch, &scores, &mut table);
            std::hint::black_box((stats, &table));
            total += scored.duration_since(t).as_secs_f64();
            selecting += scored.elapsed().as_secs_f64();
        }
        let (per, select) = (total / iters as f64, selecting / iters as f64);
        println!(
            "{name:<14} {:.3} ms per step, {:.1} ns per page-head; then {:.3} ms to select",
            per * 1e3,
            per * 1e9 / (2048.0 * 8.0),
            select * 1e3
        );
    }
}
