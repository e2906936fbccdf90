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

mod calls;
mod declarations;
mod exprs;
mod names;
mod phases;

pub use calls::OPERATORS;
pub use names::closest;

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

    /// Records an error unless it only repeats an earlier one (an empty message).
    pub(super) fn report(&mut self, d: Diagnostic) {
        if !d.message.is_empty() {
            self.errors.push(d);
        }
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

/// Per-page values beyond this would dwarf the KV page they summarise.
pub const MAX_PAGE_ELEMS: usize = 1 << 16;
/// Values any expression may take (or a page's keys, where more).
pub const MAX_VALUE_ELEMS: usize = 1 << 20;
/// A phase's per-page values together, beside four times a page's keys: a step holds some of
/// them for every page.
pub const MAX_PHASE_PAGE_ELEMS: usize = 1 << 15;
/// A phase's other values together.
pub const MAX_PHASE_STEP_ELEMS: usize = 1 << 22;
