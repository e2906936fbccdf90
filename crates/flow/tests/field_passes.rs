//! Index-phase values evaluated in one pass over page fields' stored values: Quest's score,
//! `sum(maximum(q * hi, q * lo), cols)` (an envelope), and a column sum or mean of a product by
//! a field (a field dot, as `dot(q, f)`). Each must score pages as the node-by-node evaluation
//! does, for every field dtype, and must not be taken where a part of it is needed elsewhere.

use vortex_flow::Geometry;
use vortex_flow::check::compile;
use vortex_flow::plan::Plan;
use vortex_flow::runner::{FlowRunner, StepSeq};
use vortex_kv::{KvCache, KvDtype, KvGeometry, Sequence};

const G: Geometry = Geometry {
    heads_q: 12,
    heads_kv: 2,
    head_dim: 36,
    page_size: 4,
};

/// A Quest flow with the given field dtypes; `bound` is its page bound over the query heads.
fn flow(hi: &str, lo: &str, bound: &str) -> String {
    format!(
        "flow q \"envelope\"\nparam budget = 6\n\
         page kmax[1, D] {hi}\npage kmin[1, D] {lo}\n\
         cache:\n  kmax = max(K, rows)\n  kmin = min(K, rows)\n\
         index:\n  bound = {bound}\n  score = max(bound, rows)\n  topk(score)\n"
    )
}

const ENVELOPE: &str = "sum(maximum(q * kmax, q * kmin), cols)";
/// The same value with the operands swapped: still an envelope.
const SWAPPED: &str = "sum(maximum(kmin * q, kmax * q), cols)";
/// The same value, but the products are scaled first, so no envelope applies.
const PLAIN: &str = "sum(maximum((q * kmax) * 1, (q * kmin) * 1), cols)";

fn has_envelope(runner: &FlowRunner) -> bool {
    let plan = runner.index_plan().expect("an index phase");
    plan.envelopes.iter().any(Option::is_some)
}

/// Scores of every complete page of one sequence of 90 tokens, per KV head. A head is 36
/// wide: four and a half vectors, so the envelope's tail runs too; a group of 6 query heads
/// takes a block of 4 rows and one of 2.
fn scores(source: &str) -> (Vec<Vec<f32>>, Plan) {
    scores_in(source, G)
}

/// [`scores`] in geometry `g`.
fn scores_in(source: &str, g: Geometry) -> (Vec<Vec<f32>>, Plan) {
    let runner = FlowRunner::new(compile("q.flow", source, g).expect("a valid flow"));
    let kv = KvGeometry::new(g.heads_kv, g.head_dim, g.page_size).unwrap();
    let mut cache = KvCache::new(kv, KvDtype::F32, 1, 64);
    let mut seq = Sequence::default();
    let width = g.heads_kv * g.head_dim;
    for (i, slot) in cache.append(&mut seq, 90).unwrap().into_iter().enumerate() {
        let k: Vec<f32> = (0..width)
            .map(|j| ((i * width + j) as f32 * 0.37).sin())
            .collect();
        cache
            .layer_mut(0)
            .write_token(slot.page, slot.offset, &k, &k)
            .unwrap();
    }
    let q: Vec<f32> = (0..g.heads_q * g.head_dim)
        .map(|j| (j as f32 * 0.11).cos())
        .collect();
    let complete = seq.pages[..seq.complete_pages(g.page_size)].to_vec();
    let mut fields = runner.new_fields(64);
    runner.summarize(cache.layer(0), &mut fields, &complete);
    let settings = runner.flow.settings.clone();
    let mut batch = [StepSeq {
        seq: &seq,
        settings: &settings,
        state: None,
    }];
    let plan = runner.index_plan().expect("an index phase").clone();
    (runner.scores(0, &fields, &q, &mut batch), plan)
}

fn enveloped(plan: &Plan) -> bool {
    plan.envelopes.iter().any(Option::is_some)
}

fn field_dotted(plan: &Plan) -> bool {
    plan.field_folds.iter().flatten().any(|f| f.is_dot())
}

/// Asserts two scorings agree within `rel` of each score (at least of 1).
fn assert_close(got: &[Vec<f32>], want: &[Vec<f32>], rel: f32, what: &str) {
    assert_eq!(got.len(), want.len());
    for (row, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), 22, "one score per complete page");
        for (page, (a, b)) in g.iter().zip(w).enumerate() {
            assert!(
                (a - b).abs() <= rel * b.abs().max(1.0),
                "{what}: row {row} page {page}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn envelope_scores_pages_as_the_plain_evaluation_does() {
    for (hi, lo) in [
        ("bf16", "bf16"),
        ("f16", "f16"),
        ("f32", "f32"),
        ("bf16", "f16"),
    ] {
        let (want, plain) = scores(&flow(hi, lo, PLAIN));
        assert!(
            !enveloped(&plain),
            "{hi}/{lo}: the scaled products are no envelope"
        );
        for bound in [ENVELOPE, SWAPPED] {
            let (got, plan) = scores(&flow(hi, lo, bound));
            assert!(enveloped(&plan), "{hi}/{lo}: {bound} is an envelope");
            assert_close(&got, &want, 1e-5, &format!("{hi}/{lo} {bound}"));
        }
    }
}

#[test]
fn envelope_is_not_taken_where_its_parts_are_used_elsewhere() {
    for bound in [
        // A field read again.
        "sum(maximum(q * kmax, q * kmin), cols) + sum(kmax, cols)",
        // A product read again.
        "sum(maximum(q * kmax, q * kmin), cols) + sum(q * kmax, cols)",
        // The larger product reduced otherwise than by a sum over columns.
        "max(maximum(q * kmax, q * kmin), cols)",
        // Products of one field twice.
        "sum(maximum(q * kmax, q * kmax), cols)",
    ] {
        let source = flow("bf16", "bf16", bound);
        let runner = FlowRunner::new(compile("q.flow", &source, G).expect(bound));
        assert!(!has_envelope(&runner), "{bound}");
    }
}

/// A column sum (or mean) of a product of the query and a field scores pages as `dot(q, field)`
/// does (the same pass: the same bits), and within rounding of the node-by-node evaluation.
#[test]
fn field_dots_score_pages_as_dot_products_do() {
    for dtype in ["bf16", "f16", "f32", "fp8"] {
        let (dot, _) = scores(&flow(dtype, dtype, "dot(q, kmax)"));
        let (scaled_dot, _) = scores(&flow(dtype, dtype, "dot(q, kmax) / 36"));
        for (bound, want, plain) in [
            ("sum(q * kmax, cols)", &dot, "sum((q * kmax) * 1, cols)"),
            ("sum(kmax * q, cols)", &dot, "sum((q * kmax) * 1, cols)"),
            (
                "mean(q * kmax, cols)",
                &scaled_dot,
                "mean((q * kmax) * 1, cols)",
            ),
        ] {
            let (got, plan) = scores(&flow(dtype, dtype, bound));
            assert!(field_dotted(&plan), "{dtype}: {bound} is a field dot");
            assert_close(&got, want, 0.0, &format!("{dtype} {bound} against the dot"));
            let (node_by_node, plan) = scores(&flow(dtype, dtype, plain));
            assert!(!field_dotted(&plan), "{dtype}: {plain} is no field dot");
            assert_close(&got, &node_by_node, 1e-5, &format!("{dtype} {bound}"));
        }
    }
}

#[test]
fn field_folds_are_not_taken_where_their_pair_is_used_elsewhere() {
    for bound in [
        // The product read again.
        "sum(p, cols) + max(p, cols)",
        // A product of two fields.
        "sum(kmax * kmin, cols)",
    ] {
        let source =
            flow("bf16", "bf16", bound).replace("  bound = ", "  p = q * kmax\n  bound = ");
        let runner = FlowRunner::new(compile("q.flow", &source, G).expect(bound));
        let plan = runner.index_plan().expect("an index phase");
        assert!(plan.field_folds.iter().all(Option::is_none), "{bound}");
    }
}

/// Other column reductions of a pair of the query and a field, either first, score pages
/// within rounding of the node-by-node evaluation (maxima and minima of exact pairs exactly):
/// at head_dim 36 value by value, at 48 in vector registers (three chunks of 16).
#[test]
fn field_folds_score_pages_as_the_plain_evaluation_does() {
    let wide = Geometry { head_dim: 48, ..G };
    for g in [G, wide] {
        for dtype in ["bf16", "f16", "f32", "fp8"] {
            for (pair, plain) in [
                ("q - kmax", "(q - kmax) * 1"),
                ("kmax - q", "(kmax - q) * 1"),
                ("q * kmax", "(q * kmax) * 1"),
                ("q + kmax", "(q + kmax) * 1"),
                ("maximum(kmax, q)", "maximum(kmax, q) * 1"),
                ("minimum(q, kmax)", "minimum(q, kmax) * 1"),
                ("q > kmax", "(q > kmax) * 1"),
            ] {
                for op in ["norm", "max", "min", "sum"] {
                    let (bound, reference) = (
                        format!("{op}({pair}, cols)"),
                        format!("{op}({plain}, cols)"),
                    );
                    if op == "sum" && pair == "q * kmax" {
                        continue; // a field dot, above
                    }
                    let (got, plan) = scores_in(&flow(dtype, dtype, &bound), g);
                    assert!(
                        plan.field_folds.iter().flatten().any(|f| !f.is_dot()),
                        "{dtype}: {bound} is a field fold"
                    );
                    let (want, plan) = scores_in(&flow(dtype, dtype, &reference), g);
                    assert!(plan.field_folds.iter().all(Option::is_none));
                    let exact = matches!(op, "max" | "min");
                    let what = format!("head_dim {} {dtype} {bound}", g.head_dim);
                    assert_close(&got, &want, if exact { 0.0 } else { 1e-5 }, &what);
                }
            }
        }
    }
}
