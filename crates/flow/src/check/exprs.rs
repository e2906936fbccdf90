//! Expressions: names, operators, axes, and the shapes they give.

use super::*;

impl Checker {
    /// The node of `e`, whose value must fit [`MAX_VALUE_ELEMS`] (a running flow keeps a buffer
    /// of every value, per worker thread).
    pub(super) fn expr(&mut self, ph: &mut Phase, e: &Expr) -> R<NodeId> {
        let id = self.expr_node(ph, e)?;
        let ty = ph.ty(id);
        let limit = MAX_VALUE_ELEMS.max(self.geom.page_size * self.geom.head_dim);
        if ty.elems() > limit {
            return Err(
                Diagnostic::new(e.span(), format!("the value {ty} is too large"))
                    .expected(format!("at most {limit} values")),
            );
        }
        Ok(id)
    }

    pub(super) fn expr_node(&mut self, ph: &mut Phase, e: &Expr) -> R<NodeId> {
        match e {
            Expr::Num(n, s) => Ok(ph.push(Op::Scalar(*n as f32), Ty::step(1, 1), *s)),
            Expr::Name(n, s) => self.name(ph, n, *s),
            Expr::Neg(inner, s) => {
                let a = self.expr(ph, inner)?;
                let ty = ph.ty(a);
                Ok(ph.push(Op::Unary(UnaryOp::Neg, a), ty, *s))
            }
            Expr::Binary { op, span, lhs, rhs } => {
                let (a, b) = (self.expr(ph, lhs)?, self.expr(ph, rhs)?);
                let bop = match *op {
                    "+" => BinaryOp::Add,
                    "-" => BinaryOp::Sub,
                    "*" => BinaryOp::Mul,
                    "/" => BinaryOp::Div,
                    ">" => BinaryOp::Gt,
                    ">=" => BinaryOp::Ge,
                    "<" => BinaryOp::Lt,
                    "<=" => BinaryOp::Le,
                    "==" => BinaryOp::Eq,
                    _ => BinaryOp::Ne,
                };
                self.binary(ph, bop, a, b, *span)
            }
            Expr::Call { name, span, args } => self.call(ph, name, *span, args),
        }
    }

    pub(super) fn name(&mut self, ph: &mut Phase, n: &str, s: Span) -> R<NodeId> {
        if ph.poisoned.iter().chain(&self.failed).any(|p| p == n) {
            return Err(Diagnostic::new(s, String::new()));
        }
        if let Some(&id) = ph.env.get(n) {
            return Ok(id);
        }
        if let Some(&id) = ph.memo.get(n) {
            return Ok(id);
        }
        let g = self.geom;
        let (op, ty) = match (ph.kind, n) {
            (PhaseKind::Cache, "K") => (Op::Input(Input::K), Ty::page(g.page_size, g.head_dim)),
            (PhaseKind::Cache, "V") => (Op::Input(Input::V), Ty::page(g.page_size, g.head_dim)),
            (PhaseKind::Index, "q") => (Op::Input(Input::Q), Ty::step(g.group(), g.head_dim)),
            (PhaseKind::Index, "pos") => (Op::Input(Input::Pos), Ty::page(1, 1)),
            (PhaseKind::Index, "npages") => (Op::Input(Input::NPages), Ty::step(1, 1)),
            (_, "D") => (Op::Scalar(g.head_dim as f32), Ty::step(1, 1)),
            (_, "G") => (Op::Scalar(g.group() as f32), Ty::step(1, 1)),
            (_, "P") => (Op::Scalar(g.page_size as f32), Ty::step(1, 1)),
            (PhaseKind::Index, "K" | "V") => {
                return Err(Diagnostic::new(
                    s,
                    format!("'{n}' is only available in the cache phase"),
                )
                .expected("a page field that the cache phase computed from it"));
            }
            (PhaseKind::Cache, "q" | "pos" | "npages") => {
                return Err(Diagnostic::new(
                    s,
                    format!("'{n}' is only available in the index phase"),
                )
                .expected("K or V (the cache phase sees one page, no query)"));
            }
            _ => {
                if let Some(f) = self.fields.iter().position(|f| f.name == n) {
                    if ph.kind == PhaseKind::Cache {
                        return Err(Diagnostic::new(
                            s,
                            format!("page field '{n}' is read before the cache phase writes it"),
                        )
                        .expected("a value computed earlier in the cache phase"));
                    }
                    let spec = &self.fields[f];
                    (Op::Field(f), Ty::page(spec.rows, spec.cols))
                } else if let Some(c) = self.consts.iter().position(|c| c.name == n) {
                    let c_ = &self.consts[c];
                    (Op::Const(c), Ty::step(c_.rows, c_.cols))
                } else if let Some(p) = self.params.iter_mut().find(|p| p.name == n) {
                    p.used = true;
                    (Op::Scalar(p.value), Ty::step(1, 1))
                } else if self.states.iter().any(|st| st.name == n) {
                    return Err(Diagnostic::new(s, format!("'{n}' is a state"))
                        .expected(format!("load({n}) to read it")));
                } else {
                    let mut known: Vec<&str> = ph.env.keys().map(|k| k.as_str()).collect();
                    known.extend(match ph.kind {
                        PhaseKind::Cache => ["K", "V"].as_slice(),
                        PhaseKind::Index => ["q", "pos", "npages"].as_slice(),
                    });
                    known.extend(
                        self.fields
                            .iter()
                            .map(|f| f.name.as_str())
                            .filter(|_| ph.kind == PhaseKind::Index),
                    );
                    known.extend(self.consts.iter().map(|c| c.name.as_str()));
                    known.extend(self.params.iter().map(|p| p.name.as_str()));
                    let d = Diagnostic::new(s, format!("unknown name '{n}'"));
                    return Err(match closest(n, known.iter().copied()) {
                        Some(c) => d.expected(format!("a known name such as '{c}'")),
                        None => d.expected(format!("one of: {}", known.join(", "))),
                    });
                }
            }
        };
        let id = ph.push(op, ty, s);
        ph.memo.insert(n.to_string(), id);
        Ok(id)
    }

    pub(super) fn binary(
        &mut self,
        ph: &mut Phase,
        op: BinaryOp,
        a: NodeId,
        b: NodeId,
        span: Span,
    ) -> R<NodeId> {
        let ty = broadcast(ph.ty(a), ph.ty(b)).ok_or_else(|| {
            Diagnostic::new(
                span,
                format!("shapes {} and {} do not broadcast", ph.ty(a), ph.ty(b)),
            )
            .expected("equal rows and cols, or 1 in either")
        })?;
        Ok(ph.push(Op::Binary(op, a, b), ty, span))
    }

    pub(super) fn axis(&self, ph: &Phase, e: &Expr) -> R<Axis> {
        let axis = match e {
            Expr::Name(n, _) if n == "rows" => Axis::Rows,
            Expr::Name(n, _) if n == "cols" => Axis::Cols,
            Expr::Name(n, _) if n == "pages" => Axis::Pages,
            _ => {
                return Err(
                    Diagnostic::new(e.span(), "expected an axis").expected("rows, cols or pages")
                );
            }
        };
        if axis == Axis::Pages && ph.kind == PhaseKind::Cache {
            return Err(Diagnostic::new(
                e.span(),
                "the cache phase sees one page; it cannot combine pages",
            )
            .expected("rows or cols"));
        }
        Ok(axis)
    }
}

pub(super) fn broadcast(a: Ty, b: Ty) -> Option<Ty> {
    let dim = |x: usize, y: usize| {
        if x == y || y == 1 {
            Some(x)
        } else if x == 1 {
            Some(y)
        } else {
            None
        }
    };
    Some(Ty {
        per_page: a.per_page || b.per_page,
        rows: dim(a.rows, b.rows)?,
        cols: dim(a.cols, b.cols)?,
    })
}
