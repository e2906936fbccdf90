//! Building flows from Rust, without text: the same syntax tree the parser produces.
//!
//! ```
//! use vortex_flow::build::*;
//! use vortex_flow::{Geometry, check::compile_ast};
//!
//! let flow = FlowBuilder::new("block_topk")
//!     .param("budget", 64.0)
//!     .page("centroid", dim(1), name("D"), Some("bf16"))
//!     .cache("centroid", call("mean", [name("K"), name("rows")]))
//!     .index("score", call("max", [call("dot", [name("q"), name("centroid")]), name("rows")]))
//!     .topk(name("score"))
//!     .build();
//! assert!(compile_ast(&flow, Geometry::default()).is_ok());
//! ```

use crate::ast::{Expr, FieldDecl, FlowAst, ParamDecl, Section, Stmt};
use crate::diag::Span;

/// A name (an input, a field, a value assigned earlier, an axis, `D`, `G`, `P`).
pub fn name(n: &str) -> Expr {
    Expr::Name(n.to_string(), Span::default())
}

/// A number.
pub fn num(x: f64) -> Expr {
    Expr::Num(x, Span::default())
}

/// A size in a declaration.
pub fn dim(x: usize) -> Expr {
    num(x as f64)
}

/// An operator applied to arguments.
pub fn call<const N: usize>(op: &str, args: [Expr; N]) -> Expr {
    Expr::Call {
        name: op.to_string(),
        span: Span::default(),
        args: args.into(),
    }
}

/// Builds a [`FlowAst`] statement by statement; check it with [`crate::check::compile_ast`].
pub struct FlowBuilder {
    ast: FlowAst,
    line: usize,
}

impl FlowBuilder {
    pub fn new(flow: &str) -> Self {
        Self {
            ast: FlowAst::new(flow),
            line: 1,
        }
    }

    /// A span naming the builder call, so that errors say which statement is wrong.
    fn span(&mut self) -> Span {
        self.line += 1;
        Span::new(self.line, 1, 1)
    }

    /// `value` with every position set to the statement's.
    fn placed(value: Expr, span: Span) -> Expr {
        match value {
            Expr::Num(x, _) => Expr::Num(x, span),
            Expr::Name(n, _) => Expr::Name(n, span),
            Expr::Neg(e, _) => Expr::Neg(Box::new(Self::placed(*e, span)), span),
            Expr::Call { name, args, .. } => Expr::Call {
                name,
                span,
                args: args.into_iter().map(|a| Self::placed(a, span)).collect(),
            },
            Expr::Binary { op, lhs, rhs, .. } => Expr::Binary {
                op,
                span,
                lhs: Box::new(Self::placed(*lhs, span)),
                rhs: Box::new(Self::placed(*rhs, span)),
            },
        }
    }

    pub fn about(mut self, text: &str) -> Self {
        self.ast.about = Some(text.to_string());
        self
    }

    pub fn param(mut self, setting: &str, value: f64) -> Self {
        let span = self.span();
        self.ast.params.push(ParamDecl {
            name: setting.into(),
            span,
            values: vec![(value, span)],
        });
        self
    }

    pub fn page(mut self, field: &str, rows: Expr, cols: Expr, dtype: Option<&str>) -> Self {
        let span = self.span();
        let dtype = dtype.map(|d| (d.to_string(), span));
        self.ast.pages.push(FieldDecl {
            name: field.into(),
            span,
            rows,
            cols,
            dtype,
        });
        self
    }

    pub fn state(mut self, field: &str, rows: Expr, cols: Expr) -> Self {
        let span = self.span();
        self.ast.states.push(FieldDecl {
            name: field.into(),
            span,
            rows,
            cols,
            dtype: None,
        });
        self
    }

    /// `target = value` in the cache phase.
    pub fn cache(self, target: &str, value: Expr) -> Self {
        self.statement(false, |span| Stmt::Let {
            name: target.into(),
            span,
            expr: value,
        })
    }

    /// `target = value` in the index phase.
    pub fn index(self, target: &str, value: Expr) -> Self {
        self.statement(true, |span| Stmt::Let {
            name: target.into(),
            span,
            expr: value,
        })
    }

    /// `save(state, value)` in the index phase.
    pub fn save(self, state: &str, value: Expr) -> Self {
        self.statement(true, |_| Stmt::Call(call("save", [name(state), value])))
    }

    /// The index phase's final exact top-k.
    pub fn topk(self, score: Expr) -> Self {
        self.statement(true, |_| Stmt::Call(call("topk", [score])))
    }

    /// Appends a statement to the cache or index phase, placed at the next builder position.
    fn statement(mut self, index: bool, make: impl FnOnce(Span) -> Stmt) -> Self {
        let span = self.span();
        let stmt = match make(span) {
            Stmt::Let { name, span, expr } => Stmt::Let {
                name,
                span,
                expr: Self::placed(expr, span),
            },
            Stmt::Call(e) => Stmt::Call(Self::placed(e, span)),
        };
        let phase = if index {
            &mut self.ast.index
        } else {
            &mut self.ast.cache
        };
        phase
            .get_or_insert_with(|| Section {
                span,
                stmts: vec![],
            })
            .stmts
            .push(stmt);
        self
    }

    pub fn build(self) -> FlowAst {
        self.ast
    }
}
