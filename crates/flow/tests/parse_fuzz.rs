//! The lexer, parser, checker and diagnostic renderer never panic, whatever the input: random
//! unicode, soups of flow tokens, generated flow-shaped programs, and mutations of the built-in
//! flows, each compiled for several geometries (odd and invalid ones included). Every error
//! renders as `file:line:col: error: ...` pointing into the file.
//!
//! Set `PROPTEST_RNG_SEED` to replay a run; `PROPTEST_CASES` to fuzz longer.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::Command;

use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::test_runner::TestCaseError;
use vortex_flow::check::OPERATORS;
use vortex_flow::diag::SHOWN_CHARS;
use vortex_flow::library::BUILTIN;
use vortex_flow::parser::parse;
use vortex_flow::{Diagnostic, FlowError, Geometry, Span, compile};

const FILE: &str = "fuzz.flow";

const fn geom(heads_q: usize, heads_kv: usize, head_dim: usize, page_size: usize) -> Geometry {
    Geometry {
        heads_q,
        heads_kv,
        head_dim,
        page_size,
    }
}

/// Valid geometries, from the common to the degenerate, then invalid ones (which must be
/// reported, not panic).
const GEOMETRIES: [Geometry; 9] = [
    geom(32, 8, 128, 16),
    geom(1, 1, 1, 1),
    geom(3, 3, 1, 2),
    geom(2, 1, 8, 256),
    geom(9, 3, 64, 16),
    geom(14, 2, 12, 4),
    geom(10, 4, 128, 16),
    geom(8, 8, 64, 12),
    geom(8, 0, 0, 0),
];

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        // Keep the source tree clean: no proptest-regressions files.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Checks one rendered diagnostic against its source.
fn check_diagnostic(src: &str, d: &Diagnostic) -> Result<(), TestCaseError> {
    let Span { line, col, len } = d.span;
    prop_assert!(
        line >= 1 && col >= 1 && len >= 1,
        "degenerate span {:?}",
        d.span
    );
    let lines = src.lines().count().max(1);
    prop_assert!(
        line <= lines,
        "{:?} points past the last line ({})",
        d.span,
        lines
    );
    prop_assert!(!d.message.is_empty(), "empty message");
    let text = d.render(FILE, src);
    let head = format!("{FILE}:{line}:{col}: error: ");
    prop_assert!(text.starts_with(&head), "render: {:?}", text);
    if let Some(source_line) = src.lines().nth(line - 1) {
        prop_assert!(
            col <= source_line.chars().count() + 1,
            "{:?} starts past the end of line {:?}",
            d.span,
            source_line
        );
        // The line as shown: control characters (but tabs) replaced, at most SHOWN_CHARS of
        // it, with `…` where a long one is cut.
        let shown: String = source_line
            .chars()
            .map(|c| match c.is_control() && c != '\t' {
                true => '\u{fffd}',
                false => c,
            })
            .collect();
        if shown.chars().count() <= SHOWN_CHARS {
            prop_assert!(
                text.contains(&format!("{line} | {shown}\n")),
                "render lacks the source line: {:?}",
                text
            );
        } else {
            let row = text.lines().nth(2).unwrap_or_default();
            prop_assert!(
                row.chars().count() <= format!("{line} | ").len() + SHOWN_CHARS + 2
                    && row.contains('…'),
                "a long line shown whole: {:?}",
                row
            );
        }
        prop_assert!(text.contains('^'), "render lacks a caret: {:?}", text);
    }
    let _ = d.to_string();
    Ok(())
}

fn check_error(src: &str, e: &FlowError) -> Result<(), TestCaseError> {
    prop_assert!(!e.diagnostics.is_empty(), "an error without diagnostics");
    prop_assert_eq!(&e.file, FILE);
    prop_assert_eq!(&e.source, src);
    for d in &e.diagnostics {
        check_diagnostic(src, d)?;
    }
    let all = e.render();
    let each: String = e.diagnostics.iter().map(|d| d.render(FILE, src)).collect();
    prop_assert_eq!(&all, &each);
    let _ = e.to_string();
    Ok(())
}

/// Compiles `src` for every geometry; any panic fails the case (proptest catches it and shrinks).
fn check_source(src: &str) -> Result<(), TestCaseError> {
    for g in GEOMETRIES {
        match compile(FILE, src, g) {
            Ok(flow) => {
                prop_assert_eq!(flow.geometry, g);
                // A flow that compiles lost none of its phases to a swallowed error.
                let ast = parse(src).expect("compiled, so it parses");
                prop_assert_eq!(
                    flow.index.is_some(),
                    ast.index.is_some(),
                    "index phase lost"
                );
                prop_assert_eq!(
                    flow.cache.is_some(),
                    ast.cache.is_some(),
                    "cache phase lost"
                );
                prop_assert_eq!(flow.fields.len(), ast.pages.len(), "page field lost");
                prop_assert_eq!(flow.states.len(), ast.states.len(), "state lost");
                prop_assert_eq!(flow.consts.len(), ast.consts.len(), "constant lost");
            }
            Err(e) => check_error(src, &e)?,
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Generators

/// Random unicode, control characters included.
fn unicode() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        prop::collection::vec(any::<char>(), 0..80).prop_map(|c| c.into_iter().collect()),
        prop::collection::vec(
            prop_oneof![
                any::<char>(),
                select(vec!['\n', '\t', ' ', '\r', '"', '#', '(', '[', '.', 'e'])
            ],
            0..80
        )
        .prop_map(|c| c.into_iter().collect()),
    ]
}

const WORDS: &[&str] = &[
    "flow",
    "param",
    "const",
    "page",
    "state",
    "cache",
    "index",
    "cache:",
    "index:",
    ":",
    "K",
    "V",
    "q",
    "pos",
    "npages",
    "D",
    "G",
    "P",
    "rows",
    "cols",
    "pages",
    "topk",
    "approx_topk",
    "save",
    "load",
    "fill",
    "randn",
    "range",
    "values",
    "keep",
    "slice",
    "reshape",
    "transpose",
    "dot",
    "matmul",
    "max",
    "mean",
    "sum",
    "min",
    "norm",
    "softmax",
    "normalize",
    "where",
    "mod",
    "sign",
    "bf16",
    "f16",
    "f32",
    "budget",
    "budget_ratio",
    "sinks",
    "recent",
    "dense_layers",
    "min_context",
    "tolerance",
    "x",
    "s",
    "score",
    "centroid",
    "mass",
    "channels",
    "_",
    "0",
    "1",
    "-1",
    "2",
    "8",
    "16",
    "0.5",
    ".5",
    "1.",
    "1e9",
    "1e12",
    "1e309",
    "16777216",
    "16777217",
    "1.2.3",
    "1e",
    "3e-",
    "99999999999999999999",
    "=",
    "==",
    "!=",
    ">=",
    "<=",
    "<",
    ">",
    "+",
    "-",
    "*",
    "/",
    ",",
    "(",
    ")",
    "[",
    "]",
    "\"",
    "\"about\"",
    "#",
    "# note",
    "\n",
    "\n",
    "\n",
    "\t",
    " ",
    "  ",
    "@",
    "%",
    "é",
    "\r",
    "\r\n",
    "\u{feff}",
    "\u{a0}",
    "💥",
];

/// Flow-like token soups, usually after a valid header.
fn token_soup() -> impl Strategy<Value = String> {
    (
        prop::bool::weighted(0.7),
        prop::collection::vec((select(WORDS), select(vec![" ", "", " ", "\n"])), 0..60),
    )
        .prop_map(|(header, toks)| {
            let mut s = String::from(if header { "flow t\n" } else { "" });
            for (t, sep) in toks {
                s.push_str(t);
                s.push_str(sep);
            }
            s
        })
}

fn leaf() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => select(vec![
            "K", "V", "q", "pos", "npages", "D", "G", "P", "rows", "cols", "pages", "f", "g", "st",
            "cst", "x", "s", "t", "nope",
        ]),
        1 => select(vec!["0", "1", "2", "-1", "0.5", "3", "8", "16", "128", "1e12", "16777216"]),
    ]
    .prop_map(String::from)
}

/// Expressions built from the language's operators (and a few that do not exist).
fn expr() -> impl Strategy<Value = String> {
    let mut names: Vec<&'static str> = OPERATORS.to_vec();
    names.extend([
        "topk",
        "approx_topk",
        "save",
        "load",
        "fill",
        "mx",
        "foo",
        "K",
    ]);
    leaf().prop_recursive(4, 40, 4, move |inner| {
        prop_oneof![
            3 => (select(names.clone()), prop::collection::vec(inner.clone(), 0..5))
                .prop_map(|(f, args)| format!("{f}({})", args.join(", "))),
            // Well-formed shapes of the common operators, so the checker gets deep.
            3 => (select(vec!["max", "min", "sum", "mean", "norm", "softmax", "normalize"]),
                  inner.clone(), select(vec!["rows", "cols", "pages"]))
                .prop_map(|(f, a, ax)| format!("{f}({a}, {ax})")),
            2 => (select(vec!["dot", "matmul"]), inner.clone(), inner.clone())
                .prop_map(|(f, a, b)| format!("{f}({a}, {b})")),
            1 => inner.clone().prop_map(|a| format!("keep({a}, cst)")),
            1 => (inner.clone(), select(vec!["rows", "cols"]), select(vec!["0", "1", "-1", "3"]),
                  select(vec!["1", "2", "0"]))
                .prop_map(|(a, ax, s, l)| format!("slice({a}, {ax}, {s}, {l})")),
            1 => (inner.clone(), dim(), dim()).prop_map(|(a, r, c)| format!("reshape({a}, {r}, {c})")),
            1 => (select(vec!["0", "-1", "0.5", "x"]), dim(), dim())
                .prop_map(|(v, r, c)| format!("fill({v}, {r}, {c})")),
            1 => select(vec!["st", "x", "q"]).prop_map(|s| format!("load({s})")),
            3 => (inner.clone(), select(vec!["+", "-", "*", "/", ">", ">=", "<", "<=", "==", "!="]),
                  inner.clone())
                .prop_map(|(a, op, b)| format!("{a} {op} {b}")),
            1 => inner.clone().prop_map(|a| format!("-{a}")),
            1 => inner.prop_map(|a| format!("({a})")),
        ]
    })
}

/// Sizes in declarations and size arguments.
fn dim() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        4 => select(vec!["1", "2", "D", "G", "P", "D / 8", "D * 2", "P * D", "G + 1"]),
        1 => select(vec![
            "D / 3", "0", "-1", "1.5", "16777216", "16777217", "1e12", "x", "q", "max(D, rows)",
        ]),
    ]
}

/// Sizes of constants: kept small, because a constant is materialised at compile time.
fn const_dim() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        4 => select(vec!["1", "2", "D", "G", "P", "D / 8", "G + 1"]),
        1 => select(vec!["0", "-1", "1.5", "x"]),
    ]
}

fn decl() -> impl Strategy<Value = String> {
    let num = select(vec![
        "0", "1", "2", "8", "64", "0.5", "1.5", "-1", "1e9", "1e10", "1e309",
    ]);
    prop_oneof![
        3 => (select(vec![
                "budget", "budget_ratio", "sinks", "recent", "dense_layers", "min_context",
                "tolerance", "x", "budgt", "K",
            ]), num.clone(), prop::option::of(num))
            .prop_map(|(n, v, w)| match w {
                Some(w) => format!("param {n} = {v}, {w}"),
                None => format!("param {n} = {v}"),
            }),
        3 => (select(vec!["f", "g", "x"]), dim(), dim(), select(vec!["", " bf16", " f16", " f32", "", " bf16", " int8"]))
            .prop_map(|(n, r, c, t)| format!("page {n}[{r}, {c}]{t}")),
        1 => (dim(), dim()).prop_map(|(r, c)| format!("state st[{r}, {c}]")),
        1 => (const_dim(), const_dim(), select(vec![
                "randn(1)", "fill(0)", "range(0, 8)", "range(0, 1)", "values(0, 1)", "values(1)",
                "randn(7)", "fill(-2)", "bogus(1)", "randn()", "x", "range(0, 1, 2)",
            ]))
            .prop_map(|(r, c, i)| format!("const cst[{r}, {c}] = {i}")),
    ]
}

fn stmt() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (select(vec!["f", "g", "x", "s", "t", "K", "st", "cst"]), expr())
            .prop_map(|(n, e)| format!("  {n} = {e}")),
        1 => expr().prop_map(|e| format!("  {e}")),
        1 => expr().prop_map(|e| format!("  save(st, {e})")),
        2 => (select(vec!["topk", "approx_topk"]), expr()).prop_map(|(t, e)| format!("  {t}({e})")),
        1 => Just("  topk(s)".to_string()),
    ]
}

/// Flow-shaped programs: a header, declarations, optional phases.
fn program() -> impl Strategy<Value = String> {
    (
        prop::bool::weighted(0.97),
        prop::collection::vec(decl(), 0..6),
        prop::option::weighted(0.7, prop::collection::vec(stmt(), 0..4)),
        prop::option::weighted(0.8, prop::collection::vec(stmt(), 0..5)),
    )
        .prop_map(|(header, decls, cache, index)| {
            let mut lines = vec![if header { "flow t \"fuzz\"" } else { "flaw t" }.to_string()];
            lines.extend(decls);
            if let Some(stmts) = cache {
                lines.push("cache:".into());
                lines.extend(stmts);
            }
            if let Some(stmts) = index {
                lines.push("index:".into());
                lines.extend(stmts);
            }
            lines.join("\n")
        })
}

#[derive(Debug, Clone)]
enum Mutation {
    DeleteChars(Index, usize),
    DuplicateChars(Index, usize),
    SwapChars(Index, Index),
    Insert(Index, &'static str),
    DeleteLine(Index),
    DuplicateLine(Index),
    SwapLines(Index, Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<Index>(), 1usize..8).prop_map(|(i, n)| Mutation::DeleteChars(i, n)),
        (any::<Index>(), 1usize..8).prop_map(|(i, n)| Mutation::DuplicateChars(i, n)),
        (any::<Index>(), any::<Index>()).prop_map(|(i, j)| Mutation::SwapChars(i, j)),
        (any::<Index>(), select(WORDS)).prop_map(|(i, w)| Mutation::Insert(i, w)),
        any::<Index>().prop_map(Mutation::DeleteLine),
        any::<Index>().prop_map(Mutation::DuplicateLine),
        (any::<Index>(), any::<Index>()).prop_map(|(i, j)| Mutation::SwapLines(i, j)),
    ]
}

fn mutate(src: &str, muts: &[Mutation]) -> String {
    let mut s = src.to_string();
    for m in muts {
        let mut chars: Vec<char> = s.chars().collect();
        let mut lines: Vec<String> = s.split('\n').map(String::from).collect();
        let n = chars.len();
        match *m {
            Mutation::DeleteChars(i, k) if n > 0 => {
                let at = i.index(n);
                chars.drain(at..(at + k).min(n));
            }
            Mutation::DuplicateChars(i, k) if n > 0 => {
                let at = i.index(n);
                let piece: Vec<char> = chars[at..(at + k).min(n)].to_vec();
                chars.splice(at..at, piece);
            }
            Mutation::SwapChars(i, j) if n > 0 => chars.swap(i.index(n), j.index(n)),
            Mutation::Insert(i, w) => {
                let at = i.index(n + 1);
                chars.splice(at..at, w.chars());
            }
            Mutation::DeleteLine(i) => {
                lines.remove(i.index(lines.len()));
            }
            Mutation::DuplicateLine(i) => {
                let at = i.index(lines.len());
                lines.insert(at, lines[at].clone());
            }
            Mutation::SwapLines(i, j) => {
                let len = lines.len();
                lines.swap(i.index(len), j.index(len));
            }
            _ => {}
        }
        s = match m {
            Mutation::DeleteLine(_) | Mutation::DuplicateLine(_) | Mutation::SwapLines(..) => {
                lines.join("\n")
            }
            _ => chars.into_iter().collect(),
        };
    }
    s
}

fn builtin_source() -> impl Strategy<Value = &'static str> {
    select(BUILTIN.iter().map(|(_, src)| *src).collect::<Vec<_>>())
}

// ---------------------------------------------------------------------------------------------
// Properties

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn random_unicode_never_panics(src in unicode()) {
        check_source(&src)?;
    }

    #[test]
    fn token_soup_never_panics(src in token_soup()) {
        check_source(&src)?;
    }

    #[test]
    fn mutated_builtins_never_panic(
        src in builtin_source(),
        muts in prop::collection::vec(mutation(), 1..6),
    ) {
        check_source(&mutate(src, &muts))?;
    }

    #[test]
    fn generated_programs_never_panic(src in program()) {
        check_source(&src)?;
    }

    #[test]
    fn mutated_programs_never_panic(
        src in program(),
        muts in prop::collection::vec(mutation(), 1..4),
    ) {
        check_source(&mutate(&src, &muts))?;
    }

    /// Rendering any diagnostic over any text never panics, whatever the span: past the end of
    /// the line or file, line 0, tabs, multi-byte characters, CRLF.
    #[test]
    fn render_never_panics(
        src in prop_oneof![unicode(), token_soup(), builtin_source().prop_map(String::from)],
        line in 0usize..12,
        col in 0usize..120,
        len in 0usize..40,
        message in any::<String>(),
        expected in prop::option::of(any::<String>()),
    ) {
        let d = Diagnostic { span: Span { line, col, len }, message, expected };
        let text = d.render(FILE, &src);
        let head = format!("{FILE}:{line}:{col}: error: ");
        prop_assert!(text.starts_with(&head), "render: {:?}", text);
        let _ = d.to_string();
        let e = FlowError { file: FILE.into(), source: src.clone(), diagnostics: vec![d] };
        prop_assert_eq!(e.render(), text);
    }
}

#[test]
fn builtins_compile_for_odd_geometries() {
    // double_sparse needs head_dim divisible by 8; every other built-in fits any geometry.
    for g in [
        geom(1, 1, 1, 1),
        geom(3, 3, 1, 2),
        geom(2, 1, 8, 256),
        geom(14, 2, 12, 4),
    ] {
        for (name, src) in BUILTIN {
            let r = compile(FILE, src, g);
            if name == "double_sparse" && g.head_dim % 8 != 0 {
                assert!(r.is_err(), "{name} for {g:?}");
            } else if let Err(e) = r {
                panic!("{name} for {g:?}:\n{e}");
            }
        }
    }
}

#[test]
fn every_prefix_and_suffix_of_builtins_is_handled() {
    for (_, src) in BUILTIN {
        let chars: Vec<char> = src.chars().collect();
        for cut in 0..=chars.len() {
            let head: String = chars[..cut].iter().collect();
            let tail: String = chars[cut..].iter().collect();
            for s in [head, tail] {
                if let Err(e) = check_source(&s) {
                    panic!("{e}\nsource: {s:?}");
                }
            }
        }
    }
}

#[test]
fn tabs_crlf_and_wide_characters_render() {
    let cases = [
        "flow t\n\tindex:\n\t\ts = mx(pos)\n\t\ttopk(s)\n",
        "flow t\r\nindex:\r\n  s = mx(pos)\r\n  topk(s)\r\n",
        "flow t \"ünïcödé 💥\"\nindex:\n  s = mx(pos)\n  topk(s)\n",
        "flow t\nindex:\n  s = pos # 💥 comment\n  s = mx(pos)\n",
        "flow t \"unterminated 💥\n",
        "flow t\nindex:\n  s = pos @ 💥\n",
    ];
    for src in cases {
        let e = compile(FILE, src, Geometry::default()).unwrap_err();
        check_error(src, &e).unwrap_or_else(|err| panic!("{err}\n{}", e.render()));
    }
    // The caret keeps tabs, so it lines up under the tabbed source.
    let e = compile(FILE, cases[0], Geometry::default()).unwrap_err();
    let text = e.render();
    assert!(
        text.contains("3 | \t\ts = mx(pos)\n  | \t\t    ^^"),
        "{text}"
    );
}

// ---------------------------------------------------------------------------------------------
// Regressions: inputs that currently crash. Each is a plain failing test while the bug stands.

/// Runs each source through `compile` and `render`, collecting panics instead of stopping at the
/// first, so one failing test lists every crashing input.
fn assert_no_panics(sources: &[String]) {
    let mut crashes = Vec::new();
    for src in sources {
        let r = catch_unwind(AssertUnwindSafe(|| {
            for g in GEOMETRIES {
                if let Err(e) = compile(FILE, src, g) {
                    let _ = e.render();
                }
            }
        }));
        if let Err(p) = r {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            crashes.push(format!("{src:?}: panicked: {msg}"));
        }
    }
    assert!(
        crashes.is_empty(),
        "compile panicked:\n{}",
        crashes.join("\n")
    );
}

/// Size arithmetic (`Checker::dim_value` in check/declarations.rs) saturates `*` but then adds, subtracts,
/// negates and takes `%` without overflow checks: a size whose product saturates panics.
#[test]
fn size_arithmetic_overflow_is_an_error_not_a_panic() {
    let big = "1000000 * 1000000 * 1000000 * 1000000";
    let sizes = [
        format!("{big} + 1"),
        format!("0 - {big} - {big}"),
        format!("-(-{big})"),
        format!("(-{big}) / -1"),
    ];
    let sources: Vec<String> = sizes
        .iter()
        .flat_map(|s| {
            [
                format!("flow t\npage f[{s}, 1]\ncache:\n  f = mean(K, rows)\n"),
                format!("flow t\nstate st[1, {s}]\n"),
                format!("flow t\nindex:\n  s = max(fill(1, {s}, 1), rows)\n  topk(pos)\n"),
            ]
        })
        .collect();
    assert_no_panics(&sources);
}

/// `slice` (check/calls.rs, `Checker::call`, "slice" arm) formats its out-of-range error with
/// `start + len as i64`, which overflows for a start near i64::MAX.
#[test]
fn slice_with_huge_start_is_an_error_not_a_panic() {
    let sources = [
        "flow t\nindex:\n  s = max(slice(q, cols, 1000000 * 1000000 * 1000000 * 1000000, 1), rows)\n  topk(max(s, cols))\n".to_string(),
    ];
    assert_no_panics(&sources);
}

/// Runs the named test of this binary in a child process with `VORTEX_FUZZ_CHILD` set, so an
/// abort (stack overflow, failed allocation) fails just that test instead of the whole binary.
/// In the child, runs `body`.
fn in_child_process(name: &str, body: impl FnOnce()) {
    if std::env::var_os("VORTEX_FUZZ_CHILD").is_some() {
        body();
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("VORTEX_FUZZ_CHILD", "1")
        .output()
        .expect("re-run the test binary");
    assert!(
        out.status.success(),
        "{name} crashed the process ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The parser (`Parser::expr` -> `additive` -> `term` -> `unary` -> `primary` in parser.rs), the
/// checker (`Checker::expr`, `Checker::dim_value`, which recurse as deep as the tree) and the
/// compiler-generated recursive drop of `ast::Expr` have no depth limit: deep nesting overflows
/// the stack and aborts the process. On a test thread's 2 MiB stack, 1000 nested parentheses
/// parse and 3000 overflow in the parser; a 100000-term `pos + pos + ...` parses (the loop in
/// `additive` is iterative) but overflows when its left-deep tree is dropped. A flow file is
/// user input: this should be a diagnostic ("expression nested too deeply").
#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    in_child_process("deep_nesting_is_an_error_not_a_stack_overflow", || {
        let n = 100_000;
        let sources = [
            format!(
                "flow t\nindex:\n  s = {}pos{}\n  topk(s)\n",
                "(".repeat(n),
                ")".repeat(n)
            ),
            format!("flow t\nindex:\n  s = {}pos\n  topk(s)\n", "-".repeat(n)),
            format!(
                "flow t\nindex:\n  s = pos{}\n  topk(s)\n",
                " + pos".repeat(n)
            ),
            format!(
                "flow t\nindex:\n  s = {}pos{}\n  topk(s)\n",
                "abs(".repeat(n),
                ")".repeat(n)
            ),
            format!("flow t\npage f[{}1{}, 1]\n", "(".repeat(n), ")".repeat(n)),
        ];
        for src in &sources {
            let _ = compile(FILE, src, Geometry::default());
        }
    });
}

/// `const` tensors are materialised by `consts::init_const` with no limit on their total size
/// (each dimension may be up to 16777216): this one asks for 2^48 floats and aborts the process
/// with "memory allocation of 1125899906842624 bytes failed". It should be a diagnostic.
#[test]
fn huge_constant_is_an_error_not_an_abort() {
    in_child_process("huge_constant_is_an_error_not_an_abort", || {
        let src = "flow t\nconst c[16777216, 16777216] = fill(0)\n";
        let r = compile(FILE, src, Geometry::default());
        assert!(r.is_err(), "a 2^48-element constant compiled");
    });
}
