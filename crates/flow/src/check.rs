//! The checker: resolves names, computes every value's shape for a geometry, enforces the phase
//! rules, and lowers the syntax tree to per-phase operator graphs.

use std::collections::HashMap;

use vortex_kv::{FieldSpec, KvDtype};

use crate::ast::*;
use crate::consts::init_const;
use crate::diag::{Diagnostic, FlowError, Span};
use crate::ir::*;
use crate::parser::parse;
use crate::settings::{SETTING_NAMES, Settings};

/// Parses and checks `source` (named `file` in messages) for `geometry`.
pub fn compile(file: &str, source: &str, geometry: Geometry) -> Result<Flow, FlowError> {
    let fail = |diagnostics| FlowError {
        file: file.to_string(),
        source: source.to_string(),
        diagnostics,
    };
    if let Err(e) = geometry.validate() {
        return Err(fail(vec![Diagnostic::new(
            Span::new(1, 1, 1),
            format!("bad geometry: {e}"),
        )]));
    }
    let ast = parse(source).map_err(fail)?;
    Checker::new(geometry).flow(&ast).map_err(fail)
}

/// Checks a flow built in Rust (see [`crate::build`]) for `geometry`; errors point at the
/// positions the builder gave (statement numbers).
pub fn compile_ast(ast: &FlowAst, geometry: Geometry) -> Result<Flow, Vec<Diagnostic>> {
    geometry.validate().map_err(|e| {
        vec![Diagnostic::new(
            Span::new(1, 1, 1),
            format!("bad geometry: {e}"),
        )]
    })?;
    Checker::new(geometry).flow(ast)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum PhaseKind {
    Cache,
    Index,
}

struct UserParam {
    name: String,
    value: f32,
    span: Span,
    used: bool,
}

struct Checker {
    geom: Geometry,
    errors: Vec<Diagnostic>,
    params: Vec<UserParam>,
    consts: Vec<ConstTensor>,
    fields: Vec<FieldSpec>,
    states: Vec<StateSpec>,
    /// Declared names whose declaration failed: their uses report nothing more.
    failed: Vec<String>,
}

struct Phase {
    kind: PhaseKind,
    /// Names whose definition failed: their uses report nothing more.
    poisoned: Vec<String>,
    graph: Graph,
    env: HashMap<String, NodeId>,
    memo: HashMap<String, NodeId>,
}

type R<T> = Result<T, Diagnostic>;

impl Checker {
    fn new(geom: Geometry) -> Self {
        Self {
            geom,
            errors: vec![],
            params: vec![],
            consts: vec![],
            fields: vec![],
            states: vec![],
            failed: vec![],
        }
    }

    fn flow(mut self, ast: &FlowAst) -> Result<Flow, Vec<Diagnostic>> {
        let settings = self.settings(ast);
        self.declarations(ast);
        let declared = ast
            .consts
            .iter()
            .map(|c| &c.name)
            .chain(ast.pages.iter().map(|p| &p.name))
            .chain(ast.states.iter().map(|s| &s.name));
        let ok = |n: &String| {
            self.consts.iter().any(|c| &c.name == n)
                || self.fields.iter().any(|f| &f.name == n)
                || self.states.iter().any(|s| &s.name == n)
        };
        self.failed = declared.filter(|n| !ok(n)).cloned().collect();
        let cache = ast.cache.as_ref().map(|s| self.cache_phase(s));
        let index = ast.index.as_ref().and_then(|s| self.index_phase(s));
        if cache.is_none() && !self.fields.is_empty() {
            let d = &ast.pages[0];
            self.errors.push(
                Diagnostic::new(
                    d.span,
                    format!(
                        "page field '{}' is declared but there is no cache phase to write it",
                        d.name
                    ),
                )
                .expected("a 'cache:' section"),
            );
        }
        for p in &self.params {
            if !p.used {
                let mut d = Diagnostic::new(
                    p.span,
                    format!("'{}' is neither a setting nor used by a phase", p.name),
                );
                if let Some(s) = closest(&p.name, SETTING_NAMES.iter().copied()) {
                    d = d.expected(format!("a setting such as '{s}'"));
                }
                self.errors.push(d);
            }
        }
        if !self.errors.is_empty() {
            self.errors.sort_by_key(|d| (d.span.line, d.span.col));
            return Err(self.errors);
        }
        Ok(Flow {
            name: ast.name.clone(),
            about: ast.about.clone().unwrap_or_default(),
            geometry: self.geom,
            settings,
            fields: self.fields,
            states: self.states,
            consts: self.consts,
            cache: cache.flatten(),
            index,
        })
    }

    fn settings(&mut self, ast: &FlowAst) -> Settings {
        let mut s = Settings::default();
        let mut seen: HashMap<&str, Span> = HashMap::new();
        let mut budget_given = false;
        for p in &ast.params {
            if let Some(prev) = seen.insert(&p.name, p.span) {
                self.errors.push(Diagnostic::new(
                    p.span,
                    format!("'{}' is already set on line {}", p.name, prev.line),
                ));
                continue;
            }
            let values: Vec<f64> = p.values.iter().map(|v| v.0).collect();
            if SETTING_NAMES.contains(&p.name.as_str()) {
                budget_given |= p.name == "budget" || p.name == "budget_ratio";
                if let Err(e) = s.set(&p.name, &values) {
                    let span = p
                        .values
                        .first()
                        .map_or(p.span, |v| v.1.to(p.values.last().unwrap().1));
                    self.errors.push(Diagnostic::new(span, e));
                }
            } else if let [v] = values[..] {
                self.params.push(UserParam {
                    name: p.name.clone(),
                    value: v as f32,
                    span: p.span,
                    used: false,
                });
            } else {
                let mut d = Diagnostic::new(
                    p.span,
                    format!("'{}' is not a setting, so it must be one number", p.name),
                );
                if let Some(c) = closest(&p.name, SETTING_NAMES.iter().copied()) {
                    d = d.expected(format!("a setting such as '{c}'"));
                }
                self.errors.push(d);
            }
        }
        if budget_given && !seen.contains_key("budget") {
            s.budget = None;
        }
        if let Err(e) = s.check() {
            let span = ["budget", "sinks", "recent"]
                .iter()
                .find_map(|k| seen.get(k).copied())
                .unwrap_or(Span::new(1, 1, 1));
            self.errors.push(Diagnostic::new(span, e));
        }
        s
    }

    fn declarations(&mut self, ast: &FlowAst) {
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
    fn page_shape(&self, rows: &Expr, cols: &Expr, span: Span) -> R<(usize, usize)> {
        let (r, c) = self.shape(rows, cols)?;
        if r * c > MAX_PAGE_ELEMS {
            return Err(
                Diagnostic::new(span, format!("[{r}, {c}] is too large to keep per page"))
                    .expected(format!("at most {MAX_PAGE_ELEMS} values per page")),
            );
        }
        Ok((r, c))
    }

    fn shape(&self, rows: &Expr, cols: &Expr) -> R<(usize, usize)> {
        Ok((self.dim(rows)?, self.dim(cols)?))
    }

    /// A size: whole numbers, `D` (head_dim), `G` (query heads per KV head), `P` (page_size).
    fn dim(&self, e: &Expr) -> R<usize> {
        let v = self.dim_value(e)?;
        if !(1..=1 << 24).contains(&v) {
            return Err(
                Diagnostic::new(e.span(), format!("size {v} is out of range"))
                    .expected("a size from 1 to 16777216"),
            );
        }
        Ok(v as usize)
    }

    fn dim_value(&self, e: &Expr) -> R<i64> {
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

    fn cache_phase(&mut self, section: &Section) -> Option<CachePhase> {
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

    fn index_phase(&mut self, section: &Section) -> Option<IndexPhase> {
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

    /// Records an error unless it only repeats an earlier one (an empty message).
    fn report(&mut self, d: Diagnostic) {
        if !d.message.is_empty() {
            self.errors.push(d);
        }
    }

    fn save(&mut self, ph: &mut Phase, span: Span, args: &[Expr]) -> R<(usize, NodeId)> {
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

    fn state_arg(&self, e: &Expr) -> R<usize> {
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

    fn bind(&mut self, ph: &mut Phase, name: &str, span: Span, id: NodeId) -> R<()> {
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

    /// The node of `e`, whose value must fit [`MAX_VALUE_ELEMS`] (a running flow keeps a buffer
    /// of every value, per worker thread).
    fn expr(&mut self, ph: &mut Phase, e: &Expr) -> R<NodeId> {
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

    /// Bounds the numbers a phase's values take in all: a running flow keeps a buffer of
    /// every value per worker thread, and of a per-page value for each page of a step.
    fn footprint(&mut self, graph: &Graph, section: Span) {
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

    fn expr_node(&mut self, ph: &mut Phase, e: &Expr) -> R<NodeId> {
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

    fn name(&mut self, ph: &mut Phase, n: &str, s: Span) -> R<NodeId> {
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

    fn binary(
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

    fn call(&mut self, ph: &mut Phase, name: &str, span: Span, args: &[Expr]) -> R<NodeId> {
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

    fn axis(&self, ph: &Phase, e: &Expr) -> R<Axis> {
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

impl Phase {
    fn new(kind: PhaseKind) -> Self {
        Self {
            kind,
            poisoned: Vec::new(),
            graph: Graph::default(),
            env: HashMap::new(),
            memo: HashMap::new(),
        }
    }

    fn push(&mut self, op: Op, ty: Ty, span: Span) -> NodeId {
        self.graph.push(Node {
            op,
            ty,
            span,
            name: None,
        })
    }

    fn ty(&self, id: NodeId) -> Ty {
        self.graph.nodes[id].ty
    }
}

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

fn broadcast(a: Ty, b: Ty) -> Option<Ty> {
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

fn broadcasts_to(t: Ty, rows: usize, cols: usize) -> bool {
    (t.rows == rows || t.rows == 1) && (t.cols == cols || t.cols == 1)
}

fn arity(name: &str, span: Span, args: &[Expr], n: usize, form: &str) -> R<()> {
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

/// Per-page values beyond this would dwarf the KV page they summarise.
pub const MAX_PAGE_ELEMS: usize = 1 << 16;
/// Values any expression may take (or a page's keys, where more).
pub const MAX_VALUE_ELEMS: usize = 1 << 20;
/// A phase's per-page values together, beside four times a page's keys: a step holds some of
/// them for every page.
pub const MAX_PHASE_PAGE_ELEMS: usize = 1 << 15;
/// A phase's other values together.
pub const MAX_PHASE_STEP_ELEMS: usize = 1 << 22;

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

const RESERVED: [&str; 11] = [
    "K", "V", "q", "pos", "npages", "rows", "cols", "pages", "D", "G", "P",
];

/// The candidate nearest to `name` by edit distance, if it is close enough to be a likely typo.
pub fn closest<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .map(|c| (edit_distance(name, c), c))
        .filter(|(d, c)| {
            *d <= (c.len().max(name.len()) / 3).max(1) && *d < c.len().min(name.len()).max(2)
        })
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Edits (insert, delete, substitute, swap two neighbours) that turn `a` into `b`.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]) as usize;
            d[i][j] = sub.min(d[i - 1][j] + 1).min(d[i][j - 1] + 1);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}
