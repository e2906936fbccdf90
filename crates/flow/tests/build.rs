//! A flow built in Rust checks and runs exactly like the same flow written as text.

use vortex_flow::Geometry;
use vortex_flow::build::*;
use vortex_flow::check::compile_ast;
use vortex_flow::library::load;
use vortex_flow::runner::{FlowRunner, StepSeq};
use vortex_kv::{KvCache, KvDtype, KvGeometry, Sequence};

#[test]
fn rust_built_block_topk_equals_the_builtin() {
    let g = Geometry {
        heads_q: 8,
        heads_kv: 2,
        head_dim: 32,
        page_size: 4,
    };
    let ast = FlowBuilder::new("block_topk")
        .param("budget", 6.0)
        .param("sinks", 1.0)
        .param("recent", 1.0)
        .page("centroid", dim(1), name("D"), Some("bf16"))
        .cache("centroid", call("mean", [name("K"), name("rows")]))
        .index(
            "score",
            call(
                "max",
                [call("dot", [name("q"), name("centroid")]), name("rows")],
            ),
        )
        .topk(name("score"))
        .build();
    let built = FlowRunner::new(compile_ast(&ast, g).unwrap());
    let mut text = load("block_topk", g).unwrap();
    text.settings.budget = Some(6);
    let text = FlowRunner::new(text);

    let kv = KvGeometry::new(2, 32, 4).unwrap();
    let mut cache = KvCache::new(kv, KvDtype::F32, 1, 64);
    let mut seq = Sequence::default();
    for (i, slot) in cache.append(&mut seq, 90).unwrap().into_iter().enumerate() {
        let k: Vec<f32> = (0..64)
            .map(|j| ((i * 64 + j) as f32 * 0.37).sin())
            .collect();
        cache
            .layer_mut(0)
            .write_token(slot.page, slot.offset, &k, &k)
            .unwrap();
    }
    let q: Vec<f32> = (0..8 * 32).map(|j| (j as f32 * 0.11).cos()).collect();
    let complete = seq.pages[..seq.complete_pages(4)].to_vec();
    let mut tables = Vec::new();
    for runner in [&built, &text] {
        let mut fields = runner.new_fields(64);
        runner.summarize(cache.layer(0), &mut fields, &complete);
        let settings = runner.flow.settings.clone();
        let mut batch = [StepSeq {
            seq: &seq,
            settings: &settings,
            state: None,
        }];
        let mut table = Default::default();
        runner.select(0, &fields, &q, &mut batch, &mut table);
        tables.push(table);
    }
    assert_eq!(tables[0], tables[1]);
    assert_eq!(tables[0].pages(0).len(), 6);
}

#[test]
fn rust_built_flow_errors_name_the_statement() {
    let ast = FlowBuilder::new("bad")
        .index("score", call("dto", [name("q"), name("q")]))
        .topk(name("score"))
        .build();
    let errs = compile_ast(&ast, Geometry::default()).unwrap_err();
    assert!(
        errs[0].message.contains("unknown operator 'dto'"),
        "{errs:?}"
    );
    assert_eq!(errs[0].span.line, 2, "the first builder statement");
}
