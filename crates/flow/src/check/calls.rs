//! Calls of the flow language's operators.

use super::exprs::broadcast;
use super::*;

impl Checker {
    pub(super) fn call(
        &mut self,
        ph: &mut Phase,
        name: &str,
        span: Span,
        args: &[Expr],
    ) -> R<NodeId> {
        if let Some(u) = unary_op(name) {
            arity(name, span, args, 1, "(x)")?;
            let a = self.expr(ph, &args[0])?;
            let ty = ph.ty(a);
            return Ok(ph.push(Op::Unary(u, a), ty, span));
        }
        if let Some(b) = binary_op(name) {
            arity(name, span, args, 2, "(a, b)")?;
            let (a, c) = (self.expr(ph, &args[0])?, self.expr(ph, &args[1])?);
            return self.binary(ph, b, a, c, span);
        }
        if let Some(r) = reduce_op(name) {
            arity(name, span, args, 2, "(x, rows|cols|pages)")?;
            let a = self.expr(ph, &args[0])?;
            let axis = self.axis(ph, &args[1])?;
            let ty = reduced(ph.ty(a), axis, &args[0])?;
            return Ok(ph.push(Op::Reduce(r, axis, a), ty, span));
        }
        match name {
            "softmax" | "normalize" => {
                arity(name, span, args, 2, "(x, rows|cols|pages)")?;
                let a = self.expr(ph, &args[0])?;
                let axis = self.axis(ph, &args[1])?;
                let ty = ph.ty(a);
                let red = reduced(ty, axis, &args[0])?;
                if name == "softmax" {
                    return Ok(ph.push(Op::Softmax(axis, a), ty, span));
                }
                let norm = ph.push(Op::Reduce(ReduceOp::L2Norm, axis, a), red, span);
                let eps = ph.push(Op::Scalar(1e-12), Ty::step(1, 1), span);
                let safe = ph.push(Op::Binary(BinaryOp::Max, norm, eps), red, span);
                Ok(ph.push(Op::Binary(BinaryOp::Div, a, safe), ty, span))
            }
            "where" => {
                arity(name, span, args, 3, "(condition, if_true, if_false)")?;
                let c = self.expr(ph, &args[0])?;
                let a = self.expr(ph, &args[1])?;
                let b = self.expr(ph, &args[2])?;
                let ty = broadcast(ph.ty(c), ph.ty(a))
                    .and_then(|t| broadcast(t, ph.ty(b)))
                    .ok_or_else(|| {
                        Diagnostic::new(
                            span,
                            format!(
                                "shapes {}, {} and {} do not broadcast",
                                ph.ty(c),
                                ph.ty(a),
                                ph.ty(b)
                            ),
                        )
                        .expected("equal rows and cols, or 1")
                    })?;
                Ok(ph.push(Op::Where(c, a, b), ty, span))
            }
            "dot" | "matmul" => {
                arity(name, span, args, 2, "(a, b)")?;
                let (a, b) = (self.expr(ph, &args[0])?, self.expr(ph, &args[1])?);
                let (ta, tb) = (ph.ty(a), ph.ty(b));
                let per_page = ta.per_page || tb.per_page;
                let (k_b, n) = if name == "dot" {
                    (tb.cols, tb.rows)
                } else {
                    (tb.rows, tb.cols)
                };
                if ta.cols != k_b {
                    let want = if name == "dot" {
                        "b to have as many columns as a (dot is a · bᵀ)"
                    } else {
                        "b to have as many rows as a has columns"
                    };
                    return Err(Diagnostic::new(
                        span,
                        format!(
                            "{name} of {ta} and {tb}: inner sizes {} and {k_b} differ",
                            ta.cols
                        ),
                    )
                    .expected(want));
                }
                let op = if name == "dot" {
                    Op::Dot(a, b)
                } else {
                    Op::MatMul(a, b)
                };
                Ok(ph.push(
                    op,
                    Ty {
                        per_page,
                        rows: ta.rows,
                        cols: n,
                    },
                    span,
                ))
            }
            "transpose" => {
                arity(name, span, args, 1, "(x)")?;
                let a = self.expr(ph, &args[0])?;
                let t = ph.ty(a);
                Ok(ph.push(
                    Op::Transpose(a),
                    Ty {
                        per_page: t.per_page,
                        rows: t.cols,
                        cols: t.rows,
                    },
                    span,
                ))
            }
            "reshape" => {
                arity(name, span, args, 3, "(x, ROWS, COLS)")?;
                let a = self.expr(ph, &args[0])?;
                let (r, c) = self.shape(&args[1], &args[2])?;
                let t = ph.ty(a);
                if r * c != t.elems() {
                    return Err(Diagnostic::new(
                        span,
                        format!("cannot reshape {t} ({} values) to [{r}, {c}]", t.elems()),
                    )
                    .expected("the same number of values"));
                }
                Ok(ph.push(
                    Op::Reshape(a),
                    Ty {
                        per_page: t.per_page,
                        rows: r,
                        cols: c,
                    },
                    span,
                ))
            }
            "keep" => {
                arity(name, span, args, 2, "(x, CHANNELS)")?;
                let a = self.expr(ph, &args[0])?;
                let Expr::Name(cn, cs) = &args[1] else {
                    return Err(Diagnostic::new(
                        args[1].span(),
                        "expected a constant listing columns",
                    )
                    .expected("a 'const NAME[1, N]' of column numbers"));
                };
                if self.failed.contains(cn) {
                    return Err(Diagnostic::new(*cs, String::new()));
                }
                let c = self
                    .consts
                    .iter()
                    .position(|c| &c.name == cn)
                    .ok_or_else(|| {
                        Diagnostic::new(*cs, format!("'{cn}' is not a constant"))
                            .expected("a 'const NAME[1, N]' of column numbers")
                    })?;
                let t = ph.ty(a);
                let cst = &self.consts[c];
                if cst.rows != 1 {
                    return Err(
                        Diagnostic::new(*cs, format!("'{cn}' has {} rows", cst.rows))
                            .expected("a constant with one row of column numbers"),
                    );
                }
                if let Some(bad) = cst
                    .data
                    .iter()
                    .find(|&&x| x.fract() != 0.0 || x < 0.0 || x as usize >= t.cols)
                {
                    return Err(Diagnostic::new(
                        *cs,
                        format!(
                            "'{cn}' lists column {bad}, but the value has {} columns",
                            t.cols
                        ),
                    )
                    .expected(format!("whole numbers from 0 to {}", t.cols - 1)));
                }
                Ok(ph.push(
                    Op::KeepCols(a, c),
                    Ty {
                        per_page: t.per_page,
                        rows: t.rows,
                        cols: cst.cols,
                    },
                    span,
                ))
            }
            "slice" => {
                arity(name, span, args, 4, "(x, rows|cols, START, LEN)")?;
                let a = self.expr(ph, &args[0])?;
                let axis = self.axis(ph, &args[1])?;
                let t = ph.ty(a);
                let start = self.dim_value(&args[2])?;
                let len = self.dim(&args[3])?;
                let extent = match axis {
                    Axis::Rows => t.rows,
                    Axis::Cols => t.cols,
                    Axis::Pages => {
                        return Err(Diagnostic::new(args[1].span(), "cannot slice pages")
                            .expected("rows or cols"));
                    }
                };
                if start < 0 || start as usize > extent || start as usize + len > extent {
                    return Err(Diagnostic::new(
                        span,
                        format!("a slice of {len} from {start} is outside 0..{extent}"),
                    )
                    .expected(format!("a range within 0..{extent}")));
                }
                let ty = match axis {
                    Axis::Rows => Ty { rows: len, ..t },
                    _ => Ty { cols: len, ..t },
                };
                Ok(ph.push(Op::Slice(a, axis, start as usize, len), ty, span))
            }
            "fill" => {
                arity(name, span, args, 3, "(VALUE, ROWS, COLS)")?;
                let v = match &args[0] {
                    Expr::Num(v, _) => *v as f32,
                    Expr::Neg(inner, _) if matches!(**inner, Expr::Num(..)) => match **inner {
                        Expr::Num(v, _) => -v as f32,
                        _ => unreachable!(),
                    },
                    other => {
                        return Err(Diagnostic::new(other.span(), "fill takes a number")
                            .expected("a number"));
                    }
                };
                let (r, c) = self.shape(&args[1], &args[2])?;
                Ok(ph.push(Op::Scalar(v), Ty::step(r, c), span))
            }
            "load" => {
                arity(name, span, args, 1, "(STATE)")?;
                if ph.kind == PhaseKind::Cache {
                    return Err(Diagnostic::new(
                        span,
                        "state belongs to a request; the cache phase summarises shared pages",
                    )
                    .expected("load(...) in the index phase"));
                }
                let s = self.state_arg(&args[0])?;
                let st = &self.states[s];
                Ok(ph.push(Op::LoadState(s), Ty::page(st.rows, st.cols), span))
            }
            "topk" | "approx_topk" | "save" => Err(Diagnostic::new(
                span,
                format!("{name}(...) is a statement of its own in the index phase"),
            )
            .expected("an expression")),
            _ => {
                let d = Diagnostic::new(span, format!("unknown operator '{name}'"));
                Err(match closest(name, OPERATORS.iter().copied()) {
                    Some(c) => d.expected(format!("an operator such as '{c}'")),
                    None => d.expected(format!("one of: {}", OPERATORS.join(", "))),
                })
            }
        }
    }
}

pub(super) fn arity(name: &str, span: Span, args: &[Expr], n: usize, form: &str) -> R<()> {
    if args.len() == n {
        Ok(())
    } else {
        Err(Diagnostic::new(
            span,
            format!(
                "{name} takes {n} argument{}, got {}",
                if n == 1 { "" } else { "s" },
                args.len()
            ),
        )
        .expected(format!("{name}{form}")))
    }
}

fn unary_op(name: &str) -> Option<UnaryOp> {
    Some(match name {
        "abs" => UnaryOp::Abs,
        "exp" => UnaryOp::Exp,
        "log" => UnaryOp::Log,
        "sqrt" => UnaryOp::Sqrt,
        "relu" => UnaryOp::Relu,
        "sigmoid" => UnaryOp::Sigmoid,
        "silu" => UnaryOp::Silu,
        "sign" => UnaryOp::Sign,
        "floor" => UnaryOp::Floor,
        "neg" => UnaryOp::Neg,
        _ => return None,
    })
}

fn binary_op(name: &str) -> Option<BinaryOp> {
    Some(match name {
        "add" => BinaryOp::Add,
        "sub" => BinaryOp::Sub,
        "mul" => BinaryOp::Mul,
        "div" => BinaryOp::Div,
        "maximum" => BinaryOp::Max,
        "minimum" => BinaryOp::Min,
        "gt" => BinaryOp::Gt,
        "ge" => BinaryOp::Ge,
        "lt" => BinaryOp::Lt,
        "le" => BinaryOp::Le,
        "eq" => BinaryOp::Eq,
        "ne" => BinaryOp::Ne,
        "mod" => BinaryOp::Mod,
        _ => return None,
    })
}

fn reduce_op(name: &str) -> Option<ReduceOp> {
    Some(match name {
        "sum" => ReduceOp::Sum,
        "mean" => ReduceOp::Mean,
        "max" => ReduceOp::Max,
        "min" => ReduceOp::Min,
        "norm" => ReduceOp::L2Norm,
        _ => return None,
    })
}

/// Every operator name, for messages and the language reference.
pub const OPERATORS: [&str; 37] = [
    "dot",
    "matmul",
    "sum",
    "mean",
    "max",
    "min",
    "norm",
    "softmax",
    "normalize",
    "add",
    "sub",
    "mul",
    "div",
    "maximum",
    "minimum",
    "abs",
    "exp",
    "log",
    "sqrt",
    "relu",
    "sigmoid",
    "silu",
    "sign",
    "neg",
    "gt",
    "ge",
    "lt",
    "le",
    "eq",
    "ne",
    "where",
    "keep",
    "slice",
    "transpose",
    "reshape",
    "floor",
    "mod",
];

fn reduced(t: Ty, axis: Axis, arg: &Expr) -> R<Ty> {
    Ok(match axis {
        Axis::Rows => Ty { rows: 1, ..t },
        Axis::Cols => Ty { cols: 1, ..t },
        Axis::Pages if t.per_page => Ty {
            per_page: false,
            ..t
        },
        Axis::Pages => {
            return Err(Diagnostic::new(
                arg.span(),
                format!("this value has shape {t}: it is the same for every page"),
            )
            .expected("a per-page value"));
        }
    })
}
