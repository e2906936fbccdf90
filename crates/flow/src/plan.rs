//! From an operator graph to an execution plan: which nodes run once per step, which run per
//! page, and how per-page nodes are fused into groups that run tile by tile.
//!
//! Nodes that combine pages (softmax or a reduction over `pages`) are barriers: they need every
//! page's input first. Between barriers, all per-page nodes form one fused group: for a tile of
//! pages, the group runs node after node with intermediates in a tile-sized scratch buffer that
//! stays in cache, and only values needed after the group (by a barrier, a later group, a saved
//! state or the score) are written out for all pages.

use crate::ir::{Graph, NodeId, Op};

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
    /// Page fields never loaded on their own: every use is a `dot` that reads the field's pages
    /// in their stored dtype directly.
    pub absorbed: Vec<bool>,
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
        for (i, node) in graph.nodes.iter().enumerate() {
            for j in node.op.inputs() {
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
        for (i, node) in graph.nodes.iter().enumerate() {
            if matches!(node.op, Op::Field(_)) && !materialized[i] {
                let mut uses = graph
                    .nodes
                    .iter()
                    .filter(|m| m.op.inputs().contains(&i))
                    .peekable();
                absorbed[i] = uses.peek().is_some()
                    && uses.all(|m| match m.op {
                        Op::Dot(a, b) => b == i && a != i && !graph.nodes[a].ty.per_page,
                        _ => false,
                    });
            }
        }
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
            let per_page: usize = st.group.iter().map(|&i| graph.nodes[i].ty.elems()).sum();
            st.tile_pages = (TILE_FLOATS / per_page.max(1)).clamp(1, MAX_TILE_PAGES);
        }
        Self {
            kinds,
            stages,
            materialized,
            stage_of,
            absorbed,
        }
    }
}
