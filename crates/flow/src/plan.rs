//! From an operator graph to an execution plan: which nodes run once per step, which run per
//! page, and how per-page nodes are fused into groups that run tile by tile.
//!
//! Nodes that combine pages (softmax or a reduction over `pages`) are barriers: they need every
//! page's input first. Between barriers, all per-page nodes form one fused group: for a tile of
//! pages, the group runs node after node with intermediates in a tile-sized scratch buffer that
//! stays in cache, and only values needed after the group (by a barrier, a later group, a saved
//! state or the score) are written out for all pages.

use crate::ir::{Axis, BinaryOp, Graph, NodeId, Op, ReduceOp};

/// Scratch floats per fused group and tile: sized to stay in the per-core L2 cache.
const TILE_FLOATS: usize = 32 * 1024;
const MAX_TILE_PAGES: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// Same value for every page: computed once per step (per request and KV head).
    Step,
    /// Computed page by page inside a fused group.
    Page,
    /// Combines pages: a barrier between groups.
    Cross,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Stage {
    /// Barrier nodes that open this stage.
    pub cross: Vec<NodeId>,
    /// Step nodes, computed once.
    pub step: Vec<NodeId>,
    /// The fused group: per-page nodes, run tile by tile.
    pub group: Vec<NodeId>,
    /// Pages per tile for this group.
    pub tile_pages: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub kinds: Vec<NodeKind>,
    pub stages: Vec<Stage>,
    /// Per-page nodes whose values are kept for every page (read outside their group).
    pub materialized: Vec<bool>,
    pub stage_of: Vec<usize>,
    /// Per-page nodes never evaluated on their own: page fields whose every use is a `dot`
    /// that reads the field's pages in their stored dtype directly, and the inner nodes of an
    /// [`Envelope`].
    pub absorbed: Vec<bool>,
    /// Column sums evaluated as an [`Envelope`], by node.
    pub envelopes: Vec<Option<Envelope>>,
    /// Column reductions evaluated as a [`FieldFold`], by node.
    pub field_folds: Vec<Option<FieldFold>>,
}

/// `reduce(op, cols, pair(s, f))` for an element-wise `pair` of a step value `s` (`[m, k]`) and a
/// page field of one row (`[1, k]`), either first, the pair used nowhere else: one pass over the
/// field's stored values for each row of `s`, without the `[m, k]` pairs of every page in
/// between. A sum or mean of products is the field's dot product with `s`, as `dot(s, f)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldFold {
    pub op: ReduceOp,
    pub pair: BinaryOp,
    pub step: NodeId,
    pub field: NodeId,
    /// The field is the pair's first operand.
    pub field_first: bool,
}

impl FieldFold {
    /// A sum or mean of products: the field's dot product with the step value (divided by its
    /// width for a mean).
    pub fn is_dot(&self) -> bool {
        self.pair == BinaryOp::Mul && matches!(self.op, ReduceOp::Sum | ReduceOp::Mean)
    }
}

/// `sum(maximum(s * hi, s * lo), cols)` for a step value `s` (`[m, k]`) and two page fields of
/// one row (`[1, k]`): Quest's page score. Evaluated in one pass over the fields' stored
/// values, without the `[m, k]` products of every page in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Envelope {
    pub step: NodeId,
    pub hi: NodeId,
    pub lo: NodeId,
}

impl Plan {
    /// Plans `graph`; `outputs` are nodes whose per-page values leave the phase.
    pub fn new(graph: &Graph, outputs: &[NodeId]) -> Self {
        let n = graph.nodes.len();
        let mut kinds = Vec::with_capacity(n);
        let mut stage_of = vec![0usize; n];
        for (i, node) in graph.nodes.iter().enumerate() {
            let inputs = node.op.inputs();
            let base = inputs.iter().map(|&j| stage_of[j]).max().unwrap_or(0);
            let kind = if node.op.crosses_pages() {
                NodeKind::Cross
            } else if node.ty.per_page {
                NodeKind::Page
            } else {
                NodeKind::Step
            };
            stage_of[i] = if kind == NodeKind::Cross {
                base + 1
            } else {
                base
            };
            kinds.push(kind);
        }
        let mut materialized = vec![false; n];
        // How many times each node is an input.
        let mut uses = vec![0usize; n];
        for (i, node) in graph.nodes.iter().enumerate() {
            for j in node.op.inputs() {
                uses[j] += 1;
                if kinds[j] == NodeKind::Page
                    && (kinds[i] == NodeKind::Cross || stage_of[i] != stage_of[j])
                {
                    materialized[j] = true;
                }
            }
        }
        for &o in outputs {
            if kinds[o] == NodeKind::Page {
                materialized[o] = true;
            }
        }
        let mut absorbed = vec![false; n];
        let field_folds: Vec<Option<FieldFold>> = (0..n)
            .map(|i| {
                let (f, pair) = field_fold(graph, i, &kinds, &materialized, &uses)?;
                absorbed[pair] = true;
                Some(f)
            })
            .collect();
        for (i, node) in graph.nodes.iter().enumerate() {
            if matches!(node.op, Op::Field(_)) && !materialized[i] {
                let mut uses = (0..n)
                    .filter(|&m| graph.nodes[m].op.inputs().contains(&i))
                    .peekable();
                absorbed[i] = uses.peek().is_some()
                    && uses.all(|m| match graph.nodes[m].op {
                        Op::Dot(a, b) => b == i && a != i && !graph.nodes[a].ty.per_page,
                        // The pair of a field fold: read there in its stored dtype.
                        Op::Binary(..) => absorbed[m],
                        _ => false,
                    });
            }
        }
        let envelopes: Vec<Option<Envelope>> = (0..n)
            .map(|i| {
                let (e, inner) = envelope(graph, i, &kinds, &materialized, &uses)?;
                for j in inner {
                    absorbed[j] = true;
                }
                Some(e)
            })
            .collect();
        let stages_n = stage_of.iter().max().map_or(1, |m| m + 1);
        let mut stages: Vec<Stage> = (0..stages_n)
            .map(|_| Stage {
                cross: vec![],
                step: vec![],
                group: vec![],
                tile_pages: 1,
            })
            .collect();
        for i in 0..n {
            let st = &mut stages[stage_of[i]];
            match kinds[i] {
                NodeKind::Cross => st.cross.push(i),
                NodeKind::Step => st.step.push(i),
                NodeKind::Page => st.group.push(i),
            }
        }
        for st in &mut stages {
            let per_page: usize = st
                .group
                .iter()
                .filter(|&&i| !absorbed[i])
                .map(|&i| graph.nodes[i].ty.elems())
                .sum();
            st.tile_pages = (TILE_FLOATS / per_page.max(1)).clamp(1, MAX_TILE_PAGES);
        }
        Self {
            kinds,
            stages,
            materialized,
            stage_of,
            absorbed,
            envelopes,
            field_folds,
        }
    }
}

/// Node `i` as a [`FieldFold`], with the pair it absorbs.
fn field_fold(
    graph: &Graph,
    i: NodeId,
    kinds: &[NodeKind],
    materialized: &[bool],
    uses: &[usize],
) -> Option<(FieldFold, NodeId)> {
    let Op::Reduce(op, Axis::Cols, pair) = graph.nodes[i].op else {
        return None;
    };
    let Op::Binary(binary, x, y) = graph.nodes[pair].op else {
        return None;
    };
    let is_field =
        |f: NodeId| matches!(graph.nodes[f].op, Op::Field(_)) && graph.nodes[f].ty.rows == 1;
    let is_step = |s: NodeId| kinds[s] == NodeKind::Step;
    let (step, field, field_first) = match (is_step(x) && is_field(y), is_step(y) && is_field(x)) {
        (true, _) => (x, y, false),
        (_, true) => (y, x, true),
        _ => return None,
    };
    let fits = graph.nodes[step].ty.cols == graph.nodes[field].ty.cols
        && kinds[pair] == NodeKind::Page
        && !materialized[pair]
        && uses[pair] == 1;
    fits.then_some((
        FieldFold {
            op,
            pair: binary,
            step,
            field,
            field_first,
        },
        pair,
    ))
}

/// Node `i` as an [`Envelope`], with the nodes it absorbs, when its inner nodes are per-page
/// values used nowhere else.
fn envelope(
    graph: &Graph,
    i: NodeId,
    kinds: &[NodeKind],
    materialized: &[bool],
    uses: &[usize],
) -> Option<(Envelope, [NodeId; 5])> {
    let Op::Reduce(ReduceOp::Sum, Axis::Cols, max) = graph.nodes[i].op else {
        return None;
    };
    let Op::Binary(BinaryOp::Max, a, b) = graph.nodes[max].op else {
        return None;
    };
    // One product: (step value, page field of one row), in either order.
    let product = |p: NodeId| {
        let Op::Binary(BinaryOp::Mul, x, y) = graph.nodes[p].op else {
            return None;
        };
        let is_field =
            |f: NodeId| matches!(graph.nodes[f].op, Op::Field(_)) && graph.nodes[f].ty.rows == 1;
        let is_step = |s: NodeId| kinds[s] == NodeKind::Step;
        match (is_step(x) && is_field(y), is_step(y) && is_field(x)) {
            (true, _) => Some((x, y)),
            (_, true) => Some((y, x)),
            _ => None,
        }
    };
    let ((step, hi), (step_lo, lo)) = (product(a)?, product(b)?);
    let (s, f) = (graph.nodes[step].ty, graph.nodes[hi].ty);
    let inner = [max, a, b, hi, lo];
    let used_once = |j: NodeId| uses[j] == 1;
    let fits = step == step_lo
        && a != b
        && hi != lo
        && s.cols == f.cols
        && graph.nodes[lo].ty == f
        && inner
            .iter()
            .all(|&j| kinds[j] == NodeKind::Page && !materialized[j] && used_once(j));
    fits.then_some((Envelope { step, hi, lo }, inner))
}
