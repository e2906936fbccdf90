//! The cache and index phases: their statements, saved states, names and sizes.

use super::calls::arity;
use super::declarations::RESERVED;
use super::*;

impl Checker {
    pub(super) fn cache_phase(&mut self, section: &Section) -> Option<CachePhase> {
        let mut ph = Phase::new(PhaseKind::Cache);
        let mut outputs: Vec<(usize, NodeId)> = Vec::new();
        for stmt in &section.stmts {
            let res = match stmt {
                Stmt::Let { name, span, expr } => self.expr(&mut ph, expr).and_then(|id| {
                    if let Some(f) = self.fields.iter().position(|f| &f.name == name) {
                        let spec = &self.fields[f];
                        let ty = ph.graph.nodes[id].ty;
                        if outputs.iter().any(|o| o.0 == f) {
                            return Err(Diagnostic::new(*span, format!("page field '{name}' is written twice")));
                        }
                        if !broadcasts_to(ty, spec.rows, spec.cols) {
                            return Err(Diagnostic::new(expr.span(), format!("this value has shape {ty}, which does not fit page field '{name}'")).expected(format!("[{}, {}]", spec.rows, spec.cols)));
                        }
                        outputs.push((f, id));
                    }
                    self.bind(&mut ph, name, *span, id)
                }),
                Stmt::Call(e) => Err(Diagnostic::new(e.span(), "the cache phase only assigns values").expected("'FIELD = EXPRESSION'")),
            };
            if let Err(d) = res {
                if let Stmt::Let { name, .. } = stmt {
                    ph.poisoned.push(name.clone());
                    outputs.extend(
                        self.fields
                            .iter()
                            .position(|f| &f.name == name)
                            .map(|f| (f, usize::MAX)),
                    );
                }
                self.report(d);
            }
        }
        for (i, f) in self.fields.iter().enumerate() {
            if !outputs.iter().any(|o| o.0 == i) {
                self.errors.push(
                    Diagnostic::new(
                        section.span,
                        format!("the cache phase never writes page field '{}'", f.name),
                    )
                    .expected(format!("'{} = ...'", f.name)),
                );
            }
        }
        outputs.retain(|o| o.1 != usize::MAX);
        self.footprint(&ph.graph, section.span);
        Some(CachePhase {
            graph: ph.graph,
            outputs,
        })
    }

    pub(super) fn index_phase(&mut self, section: &Section) -> Option<IndexPhase> {
        let mut ph = Phase::new(PhaseKind::Index);
        let mut saves = Vec::new();
        let mut terminal: Option<(NodeId, bool, Span)> = None;
        let mut tried_topk = false;
        for stmt in &section.stmts {
            if let Some((_, _, span)) = terminal {
                let at = match stmt {
                    Stmt::Let { span, .. } => *span,
                    Stmt::Call(e) => e.span(),
                };
                self.errors.push(Diagnostic::new(
                    at,
                    format!("nothing may follow the top-k on line {}", span.line),
                ));
                break;
            }
            let res = match stmt {
                Stmt::Let { name, span, expr } => self
                    .expr(&mut ph, expr)
                    .and_then(|id| self.bind(&mut ph, name, *span, id)),
                Stmt::Call(Expr::Call { name, span, args })
                    if name == "topk" || name == "approx_topk" =>
                {
                    tried_topk = true;
                    arity(name, *span, args, 1, "(score)")
                        .and_then(|_| self.expr(&mut ph, &args[0]))
                        .and_then(|id| {
                            let ty = ph.graph.nodes[id].ty;
                            if ty != Ty::page(1, 1) {
                                return Err(Diagnostic::new(
                                    args[0].span(),
                                    format!(
                                        "top-k needs one score per page, but this has shape {ty}"
                                    ),
                                )
                                .expected(
                                    "shape [pages, 1, 1] (reduce rows and cols, e.g. max(s, rows))",
                                ));
                            }
                            terminal = Some((id, name == "approx_topk", *span));
                            Ok(())
                        })
                }
                Stmt::Call(Expr::Call { name, span, args }) if name == "save" => {
                    self.save(&mut ph, *span, args).and_then(|s| {
                        if saves.iter().any(|&(state, _)| state == s.0) {
                            return Err(Diagnostic::new(
                                *span,
                                format!("state '{}' is saved twice", self.states[s.0].name),
                            )
                            .expected("one save of each state"));
                        }
                        saves.push(s);
                        Ok(())
                    })
                }
                Stmt::Call(e) => Err(Diagnostic::new(
                    e.span(),
                    "this value is computed but never used",
                )
                .expected("'NAME = ...', save(STATE, VALUE) or topk(SCORE)")),
            };
            if let Err(d) = res {
                if let Stmt::Let { name, .. } = stmt {
                    ph.poisoned.push(name.clone());
                }
                self.report(d);
            }
        }
        self.footprint(&ph.graph, section.span);
        match terminal {
            Some((score, approx, _)) => Some(IndexPhase {
                graph: ph.graph,
                saves,
                score,
                approx,
            }),
            None if tried_topk => None,
            None => {
                self.errors.push(
                    Diagnostic::new(section.span, "the index phase must end in a top-k")
                        .expected("'topk(SCORE)' or 'approx_topk(SCORE)' as its last line"),
                );
                None
            }
        }
    }

    pub(super) fn save(&mut self, ph: &mut Phase, span: Span, args: &[Expr]) -> R<(usize, NodeId)> {
        arity("save", span, args, 2, "(STATE, VALUE)")?;
        let state = self.state_arg(&args[0])?;
        let id = self.expr(ph, &args[1])?;
        let spec = &self.states[state];
        let ty = ph.graph.nodes[id].ty;
        if !broadcasts_to(ty, spec.rows, spec.cols) {
            return Err(Diagnostic::new(
                args[1].span(),
                format!(
                    "this value has shape {ty}, which does not fit state '{}'",
                    spec.name
                ),
            )
            .expected(format!("[pages, {}, {}]", spec.rows, spec.cols)));
        }
        Ok((state, id))
    }

    pub(super) fn state_arg(&self, e: &Expr) -> R<usize> {
        match e {
            Expr::Name(n, s) if self.failed.contains(n) => Err(Diagnostic::new(*s, String::new())),
            Expr::Name(n, s) => self
                .states
                .iter()
                .position(|st| &st.name == n)
                .ok_or_else(|| {
                    let d = Diagnostic::new(*s, format!("'{n}' is not a declared state"));
                    match closest(n, self.states.iter().map(|s| s.name.as_str())) {
                        Some(c) => d.expected(format!("a state name such as '{c}'")),
                        None => d.expected("a name declared with 'state NAME[ROWS, COLS]'"),
                    }
                }),
            _ => Err(Diagnostic::new(e.span(), "expected a state name")
                .expected("a name declared with 'state'")),
        }
    }

    pub(super) fn bind(&mut self, ph: &mut Phase, name: &str, span: Span, id: NodeId) -> R<()> {
        if RESERVED.contains(&name)
            || self.consts.iter().any(|c| c.name == name)
            || self.params.iter().any(|p| p.name == name)
            || self.states.iter().any(|s| s.name == name)
            || (ph.kind == PhaseKind::Index && self.fields.iter().any(|f| f.name == name))
        {
            return Err(
                Diagnostic::new(span, format!("'{name}' already names something else"))
                    .expected("a new name"),
            );
        }
        if ph.env.insert(name.to_string(), id).is_some() {
            return Err(Diagnostic::new(
                span,
                format!("'{name}' is already assigned in this phase"),
            )
            .expected("a new name"));
        }
        if ph.graph.nodes[id].name.is_none() {
            ph.graph.nodes[id].name = Some(name.to_string());
        }
        Ok(())
    }

    /// Bounds the numbers a phase's values take in all: a running flow keeps a buffer of
    /// every value per worker thread, and of a per-page value for each page of a step.
    pub(super) fn footprint(&mut self, graph: &Graph, section: Span) {
        let page_limit = MAX_PHASE_PAGE_ELEMS + 4 * self.geom.page_size * self.geom.head_dim;
        let (mut page, mut step) = (0usize, 0usize);
        for node in &graph.nodes {
            let total = if node.ty.per_page {
                &mut page
            } else {
                &mut step
            };
            *total = total.saturating_add(node.ty.elems());
        }
        for (what, total, limit) in [
            ("per-page values", page, page_limit),
            ("values", step, MAX_PHASE_STEP_ELEMS),
        ] {
            if total > limit {
                self.errors.push(
                    Diagnostic::new(
                        section,
                        format!("this phase's {what} take {total} numbers in all"),
                    )
                    .expected(format!("at most {limit}")),
                );
            }
        }
    }
}

fn broadcasts_to(t: Ty, rows: usize, cols: usize) -> bool {
    (t.rows == rows || t.rows == 1) && (t.cols == cols || t.cols == 1)
}
