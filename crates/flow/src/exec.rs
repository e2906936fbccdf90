//! Runs a planned phase for one work item (one sequence and KV head, or one run of pages):
//! barriers, then step nodes, then the fused group tile by tile.

use crate::ir::{ConstTensor, Graph, NodeId, Op, ReduceOp};
use crate::ops::{self, Out, View};
use crate::plan::{FieldFold, NodeKind, Plan};

/// Where a phase's leaves come from for one work item.
pub trait Leaves {
    /// Per-page leaves (K, V, a page field, a state, pos) for pages `first..first + count`,
    /// written as `count` blocks.
    fn page(&self, op: &Op, first: usize, count: usize, out: &mut [f32]);
    /// Step leaves (q, npages).
    fn step(&self, op: &Op, out: &mut [f32]);
    /// `a · fieldᵀ` for pages `first..first + count` of the page field `field` (an
    /// [`Op::Field`]), reading it in its stored dtype; `a` is one `[m, k]` block.
    fn dot_field(
        &self,
        field: &Op,
        a: &[f32],
        m: usize,
        first: usize,
        count: usize,
        out: &mut [f32],
    );
    /// The [`FieldFold`] of `a` (one `[m, k]` block) with the one-row page field `field` for
    /// pages `first..first + count`, reading the field in its stored dtype; writes `count`
    /// blocks of `m` values.
    #[allow(clippy::too_many_arguments)]
    fn fold_field(
        &self,
        field: &Op,
        fold: FieldFold,
        a: &[f32],
        m: usize,
        first: usize,
        count: usize,
        out: &mut [f32],
    );
    /// `sum(maximum(a * hi, a * lo), cols)` for pages `first..first + count` of the page
    /// fields `hi` and `lo` (one-row [`Op::Field`]s), reading them in their stored dtype; `a`
    /// is one `[m, k]` block; writes `count` blocks of `m` values.
    #[allow(clippy::too_many_arguments)]
    fn envelope_fields(
        &self,
        hi: &Op,
        lo: &Op,
        a: &[f32],
        m: usize,
        first: usize,
        count: usize,
        out: &mut [f32],
    );
}

/// Buffers for one work item, reused across work items by one thread.
#[derive(Default)]
pub struct Scratch {
    step: Vec<Vec<f32>>,
    tile: Vec<Vec<f32>>,
    full: Vec<Vec<f32>>,
}

/// A phase ready to run: its graph, plan and constants.
pub struct Program<'a> {
    pub graph: &'a Graph,
    pub plan: &'a Plan,
    pub consts: &'a [ConstTensor],
}

impl Program<'_> {
    /// Evaluates every node for a work item of `n` pages.
    pub fn run(&self, leaves: &impl Leaves, n: usize, s: &mut Scratch) {
        self.prepare(n, s);
        for (si, stage) in self.plan.stages.iter().enumerate() {
            for &id in &stage.cross {
                let node = &self.graph.nodes[id];
                let mut buf = std::mem::take(if node.ty.per_page {
                    &mut s.full[id]
                } else {
                    &mut s.step[id]
                });
                {
                    let a = self.view(s, node.op.inputs()[0], si, 0, n);
                    match node.op {
                        Op::Softmax(axis, _) => ops::softmax(
                            axis,
                            a,
                            n,
                            &mut Out {
                                data: &mut buf,
                                rows: node.ty.rows,
                                cols: node.ty.cols,
                            },
                        ),
                        Op::Reduce(r, _, _) => ops::reduce_pages(r, a, n, &mut buf),
                        _ => unreachable!("only page softmax and reductions cross pages"),
                    }
                }
                if node.ty.per_page {
                    s.full[id] = buf
                } else {
                    s.step[id] = buf
                }
            }
            for &id in &stage.step {
                let mut buf = std::mem::take(&mut s.step[id]);
                self.eval(id, si, 0, 1, leaves, s, &mut buf);
                s.step[id] = buf;
            }
            let tile = stage.tile_pages;
            let mut t0 = 0;
            while t0 < n && !stage.group.is_empty() {
                let count = tile.min(n - t0);
                for &id in &stage.group {
                    if self.plan.absorbed[id] {
                        continue;
                    }
                    let mut buf = std::mem::take(&mut s.tile[id]);
                    self.eval(id, si, t0, count, leaves, s, &mut buf);
                    if self.plan.materialized[id] {
                        let e = self.graph.nodes[id].ty.elems();
                        s.full[id][t0 * e..(t0 + count) * e].copy_from_slice(&buf[..count * e]);
                    }
                    s.tile[id] = buf;
                }
                t0 += count;
            }
        }
    }

    /// A node's value after [`run`](Self::run): all `n` pages, or one block for step values.
    pub fn value<'s>(&self, s: &'s Scratch, id: NodeId) -> View<'s> {
        let ty = self.graph.nodes[id].ty;
        let data = if ty.per_page {
            &s.full[id]
        } else {
            &s.step[id]
        };
        View {
            data,
            per_page: ty.per_page,
            rows: ty.rows,
            cols: ty.cols,
        }
    }

    fn prepare(&self, n: usize, s: &mut Scratch) {
        let len = self.graph.nodes.len();
        s.step.resize_with(len, Vec::new);
        s.tile.resize_with(len, Vec::new);
        s.full.resize_with(len, Vec::new);
        for (i, node) in self.graph.nodes.iter().enumerate() {
            let e = node.ty.elems();
            let tile = self.plan.stages[self.plan.stage_of[i]].tile_pages;
            let (step, tile, full) = match self.plan.kinds[i] {
                NodeKind::Step => (e, 0, 0),
                NodeKind::Page if self.plan.absorbed[i] => (0, 0, 0),
                NodeKind::Page => (
                    0,
                    tile * e,
                    if self.plan.materialized[i] { n * e } else { 0 },
                ),
                NodeKind::Cross if node.ty.per_page => (0, 0, n * e),
                NodeKind::Cross => (e, 0, 0),
            };
            s.step[i].resize(step, 0.0);
            s.tile[i].resize(tile, 0.0);
            s.full[i].resize(full, 0.0);
        }
    }

    /// Input `j` as seen by a node of stage `stage` working on pages `t0..t0 + count`.
    fn view<'s>(
        &self,
        s: &'s Scratch,
        j: NodeId,
        stage: usize,
        t0: usize,
        count: usize,
    ) -> View<'s> {
        let ty = self.graph.nodes[j].ty;
        let e = ty.elems();
        let data: &[f32] = if !ty.per_page {
            &s.step[j]
        } else if self.plan.kinds[j] == NodeKind::Page && self.plan.stage_of[j] == stage {
            &s.tile[j][..count * e]
        } else {
            &s.full[j][t0 * e..(t0 + count) * e]
        };
        View {
            data,
            per_page: ty.per_page,
            rows: ty.rows,
            cols: ty.cols,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn eval(
        &self,
        id: NodeId,
        stage: usize,
        t0: usize,
        count: usize,
        leaves: &impl Leaves,
        s: &Scratch,
        buf: &mut [f32],
    ) {
        let node = &self.graph.nodes[id];
        let (rows, cols) = (node.ty.rows, node.ty.cols);
        let data = &mut buf[..count * rows * cols];
        let v = |j: NodeId| self.view(s, j, stage, t0, count);
        if let Some(f) = self.plan.field_folds[id] {
            let (a, field) = (v(f.step), &self.graph.nodes[f.field].op);
            if !f.is_dot() {
                leaves.fold_field(field, f, a.data, a.rows, t0, count, data);
                return;
            }
            leaves.dot_field(field, a.data, a.rows, t0, count, data);
            if f.op == ReduceOp::Mean {
                let k = a.cols as f32;
                data.iter_mut().for_each(|x| *x /= k);
            }
            return;
        }
        if let Some(e) = self.plan.envelopes[id] {
            let (a, [hi, lo]) = (v(e.step), [e.hi, e.lo].map(|f| &self.graph.nodes[f].op));
            leaves.envelope_fields(hi, lo, a.data, a.rows, t0, count, data);
            return;
        }
        let mut out = Out { data, rows, cols };
        match node.op {
            Op::Input(_) | Op::Field(_) | Op::LoadState(_) if node.ty.per_page => {
                leaves.page(&node.op, t0, count, out.data)
            }
            Op::Input(_) | Op::Field(_) | Op::LoadState(_) => leaves.step(&node.op, out.data),
            Op::Const(c) => out.data.copy_from_slice(&self.consts[c].data),
            Op::Scalar(x) => out.data.fill(x),
            Op::Unary(u, a) => ops::unary(u, v(a), count, &mut out),
            Op::Binary(b, a, c) => ops::binary(b, v(a), v(c), count, &mut out),
            Op::Where(c, a, b) => ops::select(v(c), v(a), v(b), count, &mut out),
            Op::Reduce(r, axis, a) => ops::reduce(r, axis, v(a), count, &mut out),
            Op::Softmax(axis, a) => ops::softmax(axis, v(a), count, &mut out),
            Op::Dot(a, b) if self.plan.absorbed[b] => {
                let a = v(a);
                leaves.dot_field(&self.graph.nodes[b].op, a.data, a.rows, t0, count, out.data)
            }
            Op::Dot(a, b) => ops::dot_blocks(v(a), v(b), count, &mut out),
            Op::MatMul(a, b) => ops::matmul_blocks(v(a), v(b), count, &mut out),
            Op::Transpose(a) => ops::transpose(v(a), count, &mut out),
            Op::Reshape(a) => ops::copy(v(a), count, &mut out),
            Op::KeepCols(a, c) => {
                let cols: Vec<usize> = self.consts[c].data.iter().map(|&x| x as usize).collect();
                ops::keep_cols(v(a), &cols, count, &mut out)
            }
            Op::Slice(a, axis, start, _) => ops::slice(v(a), axis, start, count, &mut out),
        }
    }
}
