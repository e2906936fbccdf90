//! The flow's declarations: fields, states, constants and parameters, and the shapes they
//! name.

use super::*;

impl Checker {
    pub(super) fn declarations(&mut self, ast: &FlowAst) {
        let mut names: HashMap<String, Span> = HashMap::new();
        let mut claim = |this: &mut Self, name: &str, span: Span| -> bool {
            if let Some(prev) = names.insert(name.to_string(), span) {
                this.errors.push(Diagnostic::new(
                    span,
                    format!("'{name}' is already declared on line {}", prev.line),
                ));
                return false;
            }
            if RESERVED.contains(&name) {
                this.errors.push(
                    Diagnostic::new(span, format!("'{name}' is a built-in name"))
                        .expected("another name"),
                );
                return false;
            }
            true
        };
        for p in &self
            .params
            .iter()
            .map(|p| (p.name.clone(), p.span))
            .collect::<Vec<_>>()
        {
            claim(self, &p.0, p.1);
        }
        for c in &ast.consts {
            if !claim(self, &c.name, c.span) {
                continue;
            }
            match self
                .shape(&c.rows, &c.cols)
                .and_then(|(r, k)| init_const(&c.init, r, k).map(|d| (r, k, d)))
            {
                Ok((rows, cols, data)) => self.consts.push(ConstTensor {
                    name: c.name.clone(),
                    rows,
                    cols,
                    data,
                }),
                Err(d) => self.errors.push(d),
            }
        }
        for f in &ast.pages {
            if !claim(self, &f.name, f.span) {
                continue;
            }
            let dtype = match &f.dtype {
                None => KvDtype::F32,
                Some((s, span)) => match s.parse::<KvDtype>() {
                    Ok(d) => d,
                    Err(_) => {
                        self.errors.push(
                            Diagnostic::new(*span, format!("unknown dtype '{s}'"))
                                .expected("f32, f16, bf16 or fp8"),
                        );
                        continue;
                    }
                },
            };
            match self.page_shape(&f.rows, &f.cols, f.span) {
                Ok((rows, cols)) => self.fields.push(FieldSpec {
                    name: f.name.clone(),
                    rows,
                    cols,
                    dtype,
                }),
                Err(d) => self.errors.push(d),
            }
        }
        for s in &ast.states {
            if !claim(self, &s.name, s.span) {
                continue;
            }
            if let Some((_, span)) = &s.dtype {
                self.errors.push(
                    Diagnostic::new(*span, "state is always f32").expected("the end of the line"),
                );
            }
            match self.page_shape(&s.rows, &s.cols, s.span) {
                Ok((rows, cols)) => self.states.push(StateSpec {
                    name: s.name.clone(),
                    rows,
                    cols,
                }),
                Err(d) => self.errors.push(d),
            }
        }
    }

    /// The shape of a per-page value: at most [`MAX_PAGE_ELEMS`] values per page and KV head.
    pub(super) fn page_shape(&self, rows: &Expr, cols: &Expr, span: Span) -> R<(usize, usize)> {
        let (r, c) = self.shape(rows, cols)?;
        if r * c > MAX_PAGE_ELEMS {
            return Err(
                Diagnostic::new(span, format!("[{r}, {c}] is too large to keep per page"))
                    .expected(format!("at most {MAX_PAGE_ELEMS} values per page")),
            );
        }
        Ok((r, c))
    }

    pub(super) fn shape(&self, rows: &Expr, cols: &Expr) -> R<(usize, usize)> {
        Ok((self.dim(rows)?, self.dim(cols)?))
    }

    /// A size: whole numbers, `D` (head_dim), `G` (query heads per KV head), `P` (page_size).
    pub(super) fn dim(&self, e: &Expr) -> R<usize> {
        let v = self.dim_value(e)?;
        if !(1..=1 << 24).contains(&v) {
            return Err(
                Diagnostic::new(e.span(), format!("size {v} is out of range"))
                    .expected("a size from 1 to 16777216"),
            );
        }
        Ok(v as usize)
    }

    pub(super) fn dim_value(&self, e: &Expr) -> R<i64> {
        let g = &self.geom;
        let too_big = |s: Span| {
            Diagnostic::new(s, "size is out of range").expected("a size from 1 to 16777216")
        };
        match e {
            Expr::Num(n, s) if n.fract() != 0.0 => {
                Err(Diagnostic::new(*s, format!("{n} is not a whole number")).expected("a size"))
            }
            Expr::Num(n, s) if n.abs() >= 1e15 => Err(too_big(*s)),
            Expr::Num(n, _) => Ok(*n as i64),
            Expr::Name(n, s) => match n.as_str() {
                "D" => Ok(g.head_dim as i64),
                "G" => Ok(g.group() as i64),
                "P" => Ok(g.page_size as i64),
                _ => Err(Diagnostic::new(*s, format!("unknown size '{n}'")).expected(
                    "a number, D (head_dim), G (query heads per KV head) or P (page_size)",
                )),
            },
            Expr::Binary { op, span, lhs, rhs } => {
                let (a, b) = (self.dim_value(lhs)?, self.dim_value(rhs)?);
                let value = match *op {
                    "+" => a.checked_add(b),
                    "-" => a.checked_sub(b),
                    "*" => a.checked_mul(b),
                    "/" if b != 0 && a.checked_rem(b) == Some(0) => a.checked_div(b),
                    "/" => {
                        return Err(Diagnostic::new(
                            *span,
                            format!("{a} / {b} is not a whole number"),
                        ));
                    }
                    _ => {
                        return Err(Diagnostic::new(
                            *span,
                            format!("'{op}' is not allowed in a size"),
                        )
                        .expected("+, -, * or /"));
                    }
                };
                value
                    .filter(|v| v.abs() < 1 << 40)
                    .ok_or_else(|| too_big(*span))
            }
            Expr::Neg(inner, _) => Ok(-self.dim_value(inner)?),
            Expr::Call { span, name, .. } => Err(Diagnostic::new(
                *span,
                format!("'{name}(...)' is not a size"),
            )
            .expected("a number, D, G or P")),
        }
    }
}

/// Names the language itself gives meaning to.
pub(super) const RESERVED: [&str; 11] = [
    "K", "V", "q", "pos", "npages", "rows", "cols", "pages", "D", "G", "P",
];
