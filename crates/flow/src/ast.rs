//! The syntax tree of a flow, as written.

use crate::diag::Span;

#[derive(Debug, Clone, PartialEq)]
pub struct FlowAst {
    pub name: String,
    pub name_span: Span,
    pub about: Option<String>,
    pub params: Vec<ParamDecl>,
    pub consts: Vec<ConstDecl>,
    pub pages: Vec<FieldDecl>,
    pub states: Vec<FieldDecl>,
    pub cache: Option<Section>,
    pub index: Option<Section>,
}

impl FlowAst {
    /// A flow with a name and nothing else yet.
    pub fn new(name: &str) -> Self {
        FlowAst {
            name: name.to_string(),
            name_span: Span::new(1, 1, 1),
            about: None,
            params: vec![],
            consts: vec![],
            pages: vec![],
            states: vec![],
            cache: None,
            index: None,
        }
    }
}

/// `param NAME = VALUE[, VALUE...]`: a setting (budget, sinks, ...) or a scalar the phases use.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamDecl {
    pub name: String,
    pub span: Span,
    pub values: Vec<(f64, Span)>,
}

/// `page NAME[ROWS, COLS] [DTYPE]` or `state NAME[ROWS, COLS]`.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldDecl {
    pub name: String,
    pub span: Span,
    pub rows: Expr,
    pub cols: Expr,
    pub dtype: Option<(String, Span)>,
}

/// `const NAME[ROWS, COLS] = INIT`: a constant tensor shared by every request.
#[derive(Debug, Clone, PartialEq)]
pub struct ConstDecl {
    pub name: String,
    pub span: Span,
    pub rows: Expr,
    pub cols: Expr,
    pub init: Expr,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Section {
    pub span: Span,
    pub stmts: Vec<Stmt>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Stmt {
    /// `NAME = EXPR`
    Let {
        name: String,
        span: Span,
        expr: Expr,
    },
    /// A call for its effect: `save(...)`, `topk(...)`, `approx_topk(...)`.
    Call(Expr),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Num(f64, Span),
    Name(String, Span),
    Call {
        name: String,
        span: Span,
        args: Vec<Expr>,
    },
    Binary {
        op: &'static str,
        span: Span,
        lhs: Box<Expr>,
        rhs: Box<Expr>,
    },
    Neg(Box<Expr>, Span),
}

impl Expr {
    pub fn span(&self) -> Span {
        match self {
            Expr::Num(_, s) | Expr::Name(_, s) | Expr::Neg(_, s) => *s,
            Expr::Call { span, .. } | Expr::Binary { span, .. } => *span,
        }
    }
}
