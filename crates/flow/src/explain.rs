//! What a flow costs and how it runs: the operator graphs, the fusion groups, and the bytes each
//! phase reads and writes.

use std::fmt::Write;

use serde::Serialize;
use vortex_kv::KvDtype;

use crate::ir::{Flow, Graph, Input, Op};
use crate::plan::{NodeKind, Plan};
use crate::runner::FlowRunner;

/// Bytes a flow moves, for all KV heads of one layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct FlowCost {
    /// Cache phase: K/V bytes read per summarised page.
    pub cache_read_per_page: usize,
    /// Cache phase: summary bytes written per page.
    pub cache_write_per_page: usize,
    /// Index phase: summary and state bytes read per scored page and step.
    pub index_read_per_page: usize,
    /// Index phase: state bytes written per scored page and step.
    pub index_write_per_page: usize,
}

impl FlowCost {
    pub fn of(flow: &Flow, kv_dtype: KvDtype) -> Self {
        let g = flow.geometry;
        let heads = g.heads_kv;
        let mut cost = FlowCost::default();
        if let Some(cache) = &flow.cache {
            let kv = g.page_size * g.head_dim * kv_dtype.size() * heads;
            cost.cache_read_per_page = leaves(&cache.graph)
                .filter(|op| matches!(op, Op::Input(Input::K) | Op::Input(Input::V)))
                .count()
                * kv;
            cost.cache_write_per_page = flow
                .fields
                .iter()
                .map(|f| f.elems() * f.dtype.size())
                .sum::<usize>()
                * heads;
        }
        if let Some(index) = &flow.index {
            for op in leaves(&index.graph) {
                cost.index_read_per_page += heads
                    * match *op {
                        Op::Field(f) => flow.fields[f].elems() * flow.fields[f].dtype.size(),
                        Op::LoadState(s) => flow.states[s].rows * flow.states[s].cols * 4,
                        _ => 0,
                    };
            }
            cost.index_write_per_page = index
                .saves
                .iter()
                .map(|&(s, _)| flow.states[s].rows * flow.states[s].cols * 4)
                .sum::<usize>()
                * heads;
        }
        cost
    }
}

fn leaves(graph: &Graph) -> impl Iterator<Item = &Op> {
    graph.nodes.iter().map(|n| &n.op)
}

/// A human-readable account of a flow: settings, graphs, fusion groups and bytes.
pub fn explain(runner: &FlowRunner, kv_dtype: KvDtype) -> String {
    let flow = &runner.flow;
    let g = flow.geometry;
    let mut s = String::new();
    let _ = writeln!(s, "flow {} — {}", flow.name, flow.about);
    let _ = writeln!(
        s,
        "geometry: {} query heads, {} KV heads (group {}), head_dim {}, page_size {}; KV {}",
        g.heads_q,
        g.heads_kv,
        g.group(),
        g.head_dim,
        g.page_size,
        kv_dtype
    );
    let st = &flow.settings;
    let budget = match (st.budget, st.budget_ratio) {
        (Some(b), Some(r)) => format!("max({b} pages, {r} of the pages)"),
        (Some(b), None) => format!("{b} pages"),
        (None, Some(r)) => format!("{r} of the pages"),
        (None, None) => "none".into(),
    };
    let _ = writeln!(
        s,
        "settings: budget {budget}, sinks {}, recent {}, dense layers {:?}, min context {}, tolerance {}",
        st.sinks, st.recent, st.dense_layers, st.min_context, st.tolerance
    );
    for f in &flow.fields {
        let _ = writeln!(
            s,
            "page field {}[{}, {}] {}",
            f.name, f.rows, f.cols, f.dtype
        );
    }
    for f in &flow.states {
        let _ = writeln!(s, "state {}[{}, {}] f32", f.name, f.rows, f.cols);
    }
    if let (Some(c), Some(plan)) = (&flow.cache, runner.cache_plan()) {
        let _ = writeln!(s, "\ncache phase (once per completed page and KV head):");
        graph(&mut s, flow, &c.graph, plan);
    }
    if let (Some(ix), Some(plan)) = (&flow.index, runner.index_plan()) {
        let kind = if ix.approx { "approximate" } else { "exact" };
        let _ = writeln!(
            s,
            "\nindex phase (every step, per sequence and KV head; ends in {kind} top-k of %{}):",
            ix.score
        );
        graph(&mut s, flow, &ix.graph, plan);
    }
    if flow.index.is_none() {
        let _ = writeln!(
            s,
            "\nno index phase: pages beyond sinks and recent rank by recency"
        );
    }
    let cost = FlowCost::of(flow, kv_dtype);
    let kv_page = 2 * g.page_size * g.head_dim * kv_dtype.size() * g.heads_kv;
    let _ = writeln!(s, "\nbytes (all {} KV heads of a layer):", g.heads_kv);
    let _ = writeln!(
        s,
        "  cache phase, per page: reads {} B, writes {} B",
        cost.cache_read_per_page, cost.cache_write_per_page
    );
    let _ = writeln!(
        s,
        "  index phase, per scored page and step: reads {} B, writes {} B ({:.2}% of the page's K+V, {} B)",
        cost.index_read_per_page,
        cost.index_write_per_page,
        100.0 * (cost.index_read_per_page + cost.index_write_per_page) as f64 / kv_page as f64,
        kv_page
    );
    s
}

fn graph(s: &mut String, flow: &Flow, graph: &Graph, plan: &Plan) {
    for (i, n) in graph.nodes.iter().enumerate() {
        let args: Vec<String> = n.op.inputs().iter().map(|j| format!("%{j}")).collect();
        let label = match n.op {
            Op::Field(f) => format!("field {}", flow.fields[f].name),
            Op::LoadState(st) => format!("load {}", flow.states[st].name),
            Op::Const(c) => format!("const {}", flow.consts[c].name),
            Op::KeepCols(_, c) => format!("KeepCols[{}]", flow.consts[c].name),
            _ => n.op.label(),
        };
        let name = n
            .name
            .as_deref()
            .map(|x| format!("  # {x}"))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "  %{i:<3} = {label}({}) : {}{name}",
            args.join(", "),
            n.ty
        );
    }
    for (k, st) in plan.stages.iter().enumerate() {
        let ids = |v: &[usize]| {
            v.iter()
                .map(|i| format!("%{i}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let mut line = format!("  stage {k}:");
        if !st.cross.is_empty() {
            line += &format!(" barrier {{{}}};", ids(&st.cross));
        }
        if !st.step.is_empty() {
            line += &format!(" once per step {{{}}};", ids(&st.step));
        }
        if !st.group.is_empty() {
            let kept: Vec<usize> = st
                .group
                .iter()
                .copied()
                .filter(|&i| plan.materialized[i])
                .collect();
            line += &format!(
                " fused group {{{}}} in tiles of {} pages, writes out {{{}}}",
                ids(&st.group),
                st.tile_pages,
                ids(&kept)
            );
        }
        let _ = writeln!(s, "{line}");
        debug_assert!(st.group.iter().all(|&i| plan.kinds[i] == NodeKind::Page));
    }
    for (i, e) in plan.envelopes.iter().enumerate() {
        if let Some(e) = e {
            let _ = writeln!(
                s,
                "  %{i} is one envelope pass over the stored fields %{} and %{} with %{} (the \
                 nodes between are never evaluated)",
                e.hi, e.lo, e.step
            );
        }
    }
    for (i, f) in plan.field_folds.iter().enumerate() {
        if let Some(f) = f {
            let _ = writeln!(
                s,
                "  %{i} is one pass of {:?} over the stored field %{} paired with %{} (the pairs \
                 are never evaluated)",
                f.op, f.field, f.step
            );
        }
    }
}
