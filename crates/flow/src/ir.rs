//! The checked form of a flow: per phase, a DAG of typed operator nodes in evaluation order.

use vortex_kv::FieldSpec;

use crate::diag::Span;
use crate::settings::Settings;

pub type NodeId = usize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    Rows,
    Cols,
    Pages,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Relu,
    Sigmoid,
    Silu,
    Sign,
    Floor,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
    Gt,
    Ge,
    Lt,
    Le,
    Eq,
    Ne,
    /// `a - b * floor(a / b)`.
    Mod,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
    L2Norm,
}

/// Values the engine provides to a phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// The page's keys `[P, D]` (cache phase).
    K,
    /// The page's values `[P, D]` (cache phase).
    V,
    /// The step's queries of this KV group `[G, D]` (index phase).
    Q,
    /// The page's position in the sequence, 0-based `[1, 1]` per page (index phase).
    Pos,
    /// The number of pages scored this step `[1, 1]` (index phase).
    NPages,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Input(Input),
    /// A per-page summary field (index phase).
    Field(usize),
    /// `load(state)`: this request's per-page state.
    LoadState(usize),
    Const(usize),
    Scalar(f32),
    Unary(UnaryOp, NodeId),
    Binary(BinaryOp, NodeId, NodeId),
    Where(NodeId, NodeId, NodeId),
    Reduce(ReduceOp, Axis, NodeId),
    Softmax(Axis, NodeId),
    /// `a · bᵀ`: `[M, K] x [N, K] -> [M, N]`.
    Dot(NodeId, NodeId),
    /// `a · b`: `[M, K] x [K, N] -> [M, N]`.
    MatMul(NodeId, NodeId),
    Transpose(NodeId),
    Reshape(NodeId),
    /// Keeps the columns listed by a constant.
    KeepCols(NodeId, usize),
    /// `len` rows or columns from `start`.
    Slice(NodeId, Axis, usize, usize),
}

/// A node's logical shape: `[pages, rows, cols]` when `per_page`, else `[1, rows, cols]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ty {
    pub per_page: bool,
    pub rows: usize,
    pub cols: usize,
}

impl Ty {
    pub fn step(rows: usize, cols: usize) -> Self {
        Self {
            per_page: false,
            rows,
            cols,
        }
    }
    pub fn page(rows: usize, cols: usize) -> Self {
        Self {
            per_page: true,
            rows,
            cols,
        }
    }
    pub fn elems(&self) -> usize {
        self.rows * self.cols
    }
}

impl std::fmt::Display for Ty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = if self.per_page { "pages" } else { "1" };
        write!(f, "[{n}, {}, {}]", self.rows, self.cols)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub op: Op,
    pub ty: Ty,
    pub span: Span,
    /// The flow's name for this value, when it has one.
    pub name: Option<String>,
}

impl Op {
    pub fn inputs(&self) -> Vec<NodeId> {
        match *self {
            Op::Input(_) | Op::Field(_) | Op::LoadState(_) | Op::Const(_) | Op::Scalar(_) => vec![],
            Op::Unary(_, a)
            | Op::Reduce(_, _, a)
            | Op::Softmax(_, a)
            | Op::Transpose(a)
            | Op::Reshape(a)
            | Op::KeepCols(a, _)
            | Op::Slice(a, _, _, _) => vec![a],
            Op::Binary(_, a, b) | Op::Dot(a, b) | Op::MatMul(a, b) => vec![a, b],
            Op::Where(c, a, b) => vec![c, a, b],
        }
    }

    /// Operators that need every page's value before they can produce any.
    pub fn crosses_pages(&self) -> bool {
        matches!(
            self,
            Op::Reduce(_, Axis::Pages, _) | Op::Softmax(Axis::Pages, _)
        )
    }

    pub fn label(&self) -> String {
        match self {
            Op::Input(i) => format!("{i:?}"),
            Op::Field(f) => format!("field#{f}"),
            Op::LoadState(s) => format!("load#{s}"),
            Op::Const(c) => format!("const#{c}"),
            Op::Scalar(x) => format!("{x}"),
            Op::Unary(u, _) => format!("{u:?}"),
            Op::Binary(b, _, _) => format!("{b:?}"),
            Op::Where(..) => "Where".into(),
            Op::Reduce(r, a, _) => format!("{r:?}({a:?})"),
            Op::Softmax(a, _) => format!("Softmax({a:?})"),
            Op::Dot(..) => "Dot".into(),
            Op::MatMul(..) => "MatMul".into(),
            Op::Transpose(_) => "Transpose".into(),
            Op::Reshape(_) => "Reshape".into(),
            Op::KeepCols(..) => "KeepCols".into(),
            Op::Slice(_, a, s, l) => format!("Slice({a:?}, {s}, {l})"),
        }
    }
}

/// One phase's DAG.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Graph {
    pub nodes: Vec<Node>,
}

impl Graph {
    pub fn push(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        self.nodes.len() - 1
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct CachePhase {
    pub graph: Graph,
    /// `(field, node)`: the node whose value is stored as the field.
    pub outputs: Vec<(usize, NodeId)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct IndexPhase {
    pub graph: Graph,
    /// `(state, node)`: stored into the request's state after scoring.
    pub saves: Vec<(usize, NodeId)>,
    /// One score per page; the top pages are kept.
    pub score: NodeId,
    pub approx: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StateSpec {
    pub name: String,
    pub rows: usize,
    pub cols: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ConstTensor {
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

/// Geometry a flow is compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub heads_q: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
    pub page_size: usize,
}

impl Geometry {
    pub fn group(&self) -> usize {
        self.heads_q / self.heads_kv
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.heads_q == 0 || self.heads_kv == 0 || self.head_dim == 0 {
            return Err("heads and head_dim must be at least 1".into());
        }
        if self.heads_q > MAX_DIM || self.head_dim > MAX_DIM {
            return Err(format!("heads and head_dim must be at most {MAX_DIM}"));
        }
        if !self.heads_q.is_multiple_of(self.heads_kv) {
            return Err(format!(
                "{} query heads cannot be grouped over {} KV heads (not a multiple)",
                self.heads_q, self.heads_kv
            ));
        }
        vortex_kv::geometry::check_page_size(self.page_size).map_err(|e| e.to_string())
    }
}

/// The most query heads, and the widest head, a geometry may have.
const MAX_DIM: usize = 4096;

impl Default for Geometry {
    /// The Qwen3-8B / Llama-3-8B attention shape.
    fn default() -> Self {
        Self {
            heads_q: 32,
            heads_kv: 8,
            head_dim: 128,
            page_size: 16,
        }
    }
}

/// A flow checked against a geometry, ready to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Flow {
    pub name: String,
    pub about: String,
    pub geometry: Geometry,
    pub settings: Settings,
    pub fields: Vec<FieldSpec>,
    pub states: Vec<StateSpec>,
    pub consts: Vec<ConstTensor>,
    pub cache: Option<CachePhase>,
    pub index: Option<IndexPhase>,
}
