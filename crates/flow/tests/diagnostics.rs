//! Bad flows give clear errors: `file:line:col: error: message`, the offending source line, a
//! caret under the right place, and (where the checker knows) what was expected there.

use vortex_flow::library::builtin_source;
use vortex_flow::{Diagnostic, FlowError, Geometry, compile};

const FILE: &str = "bad.flow";

/// A valid flow; each test breaks one line of it. Line numbers:
///  1 flow, 3-5 params, 7 page, 9 cache:, 10 centroid =, 12 index:, 13 score =, 14 topk.
const BASE: &str = "\
flow t \"a test flow\"

param budget = 8
param sinks = 1
param recent = 1

page centroid[1, D] bf16

cache:
  centroid = mean(K, rows)

index:
  score = max(dot(q, centroid), rows)
  topk(score)
";

/// heads_q 32, heads_kv 8 (G = 4), head_dim 128, page_size 16.
fn geometry() -> Geometry {
    Geometry::default()
}

/// `BASE` with `old` (which must occur exactly once) replaced by `new`.
fn edit(old: &str, new: &str) -> String {
    assert_eq!(
        BASE.matches(old).count(),
        1,
        "{old:?} must occur once in BASE"
    );
    BASE.replace(old, new)
}

fn errors_for(src: &str, g: Geometry) -> FlowError {
    match compile(FILE, src, g) {
        Ok(_) => panic!("expected an error, but this compiled:\n{src}"),
        Err(e) => e,
    }
}

/// What one diagnostic must look like.
struct Want<'a> {
    line: usize,
    col: usize,
    /// The source text the caret underlines.
    under: &'a str,
    /// A part of the message.
    message: &'a str,
    /// A part of the "expected ..." hint, when there must be one.
    expected: Option<&'a str>,
}

/// Finds the diagnostic whose message contains `want.message` and checks its place, its
/// rendering and its hint. Returns the whole error for further checks.
fn check(src: &str, g: Geometry, want: Want) -> FlowError {
    let e = errors_for(src, g);
    let all = e.render();
    let d: &Diagnostic = e
        .diagnostics
        .iter()
        .find(|d| d.message.contains(want.message))
        .unwrap_or_else(|| panic!("no error says {:?}; got:\n{all}", want.message));
    let ctx = format!("for {:?}; got:\n{all}", want.message);
    assert_eq!(
        (d.span.line, d.span.col),
        (want.line, want.col),
        "wrong line:col {ctx}"
    );

    let text = d.render(FILE, src);
    let head = format!("{FILE}:{}:{}: error: {}", want.line, want.col, d.message);
    assert!(
        text.starts_with(&head),
        "render must start with {head:?} {ctx}"
    );

    // The source line, then a caret line whose '^'s sit under `under`.
    let source_line = src.lines().nth(want.line - 1).unwrap();
    let rendered: Vec<&str> = text.lines().collect();
    let gutter = format!("{} | ", want.line);
    let at = rendered
        .iter()
        .position(|l| *l == format!("{gutter}{source_line}"))
        .unwrap_or_else(|| panic!("render lacks the source line {source_line:?} {ctx}"));
    let caret_line = rendered
        .get(at + 1)
        .unwrap_or_else(|| panic!("no caret line {ctx}"));
    let pad = " ".repeat(gutter.len() - 2);
    let caret_prefix = format!("{pad}| ");
    assert!(
        caret_line.starts_with(&caret_prefix),
        "caret line {caret_line:?} {ctx}"
    );
    let marks: Vec<char> = caret_line[caret_prefix.len()..].chars().collect();
    let first = marks
        .iter()
        .position(|&c| c == '^')
        .unwrap_or_else(|| panic!("no caret {ctx}"));
    assert!(
        marks[..first].iter().all(|&c| c == ' ' || c == '\t'),
        "caret line {caret_line:?} {ctx}"
    );
    assert_eq!(first + 1, want.col, "caret column {ctx}");
    let carets = marks[first..].iter().take_while(|&&c| c == '^').count();
    let underlined: String = source_line.chars().skip(first).take(carets).collect();
    assert_eq!(
        underlined, want.under,
        "caret underlines the wrong text {ctx}"
    );

    if let Some(hint) = want.expected {
        let got = d
            .expected
            .as_deref()
            .unwrap_or_else(|| panic!("no 'expected ...' hint {ctx}"));
        assert!(got.contains(hint), "hint {got:?} lacks {hint:?} {ctx}");
        assert!(
            caret_line.contains(&format!(" expected {got}")),
            "the hint follows the caret {ctx}"
        );
    }
    assert!(
        all.starts_with(&format!("{FILE}:")),
        "the whole error starts with the file {ctx}"
    );
    e
}

fn check_base(old: &str, new: &str, want: Want) -> FlowError {
    check(&edit(old, new), geometry(), want)
}

#[test]
fn base_flow_compiles() {
    compile(FILE, BASE, geometry()).unwrap();
}

#[test]
fn unknown_operator_suggests_the_closest() {
    check_base(
        "max(dot(q, centroid), rows)",
        "mx(dot(q, centroid), rows)",
        Want {
            line: 13,
            col: 11,
            under: "mx",
            message: "unknown operator 'mx'",
            expected: Some("an operator such as 'max'"),
        },
    );
    // Nothing close: list the operators.
    check_base(
        "mean(K, rows)",
        "frobnicate(K, rows)",
        Want {
            line: 10,
            col: 14,
            under: "frobnicate",
            message: "unknown operator 'frobnicate'",
            expected: Some("one of: dot, matmul"),
        },
    );
}

#[test]
fn unknown_name_suggests_the_closest() {
    check_base(
        "dot(q, centroid)",
        "dot(qq, centroid)",
        Want {
            line: 13,
            col: 19,
            under: "qq",
            message: "unknown name 'qq'",
            expected: Some("'q'"),
        },
    );
    check_base(
        "dot(q, centroid)",
        "dot(q, centriod)",
        Want {
            line: 13,
            col: 22,
            under: "centriod",
            message: "unknown name 'centriod'",
            expected: Some("'centroid'"),
        },
    );
}

#[test]
fn wrong_arity() {
    check_base(
        "mean(K, rows)",
        "mean(K)",
        Want {
            line: 10,
            col: 14,
            under: "mean",
            message: "mean takes 2 arguments, got 1",
            expected: Some("mean(x, rows|cols|pages)"),
        },
    );
    check_base(
        "topk(score)",
        "topk(score, 8)",
        Want {
            line: 14,
            col: 3,
            under: "topk",
            message: "topk takes 1 argument, got 2",
            expected: Some("topk(score)"),
        },
    );
    check_base(
        "dot(q, centroid)",
        "dot(q, centroid, q)",
        Want {
            line: 13,
            col: 15,
            under: "dot",
            message: "dot takes 2 arguments, got 3",
            expected: Some("dot(a, b)"),
        },
    );
}

#[test]
fn shape_mismatches() {
    // dot of [G, D] with [1, P]: a · bᵀ needs equal columns (128 vs 16).
    check_base(
        "dot(q, centroid)",
        "dot(q, fill(1, 1, P))",
        Want {
            line: 13,
            col: 15,
            under: "dot",
            message: "dot of [1, 4, 128] and [1, 1, 16]: inner sizes 128 and 16 differ",
            expected: Some("b to have as many columns as a"),
        },
    );
    check_base(
        "max(dot(q, centroid), rows)",
        "max(matmul(q, centroid), rows)",
        Want {
            line: 13,
            col: 15,
            under: "matmul",
            message: "matmul of [1, 4, 128] and [pages, 1, 128]: inner sizes 128 and 1 differ",
            expected: Some("b to have as many rows as a has columns"),
        },
    );
    check_base(
        "max(dot(q, centroid), rows)",
        "max(q + fill(1, 3, 5), rows)",
        Want {
            line: 13,
            col: 17,
            under: "+",
            message: "shapes [1, 4, 128] and [1, 3, 5] do not broadcast",
            expected: Some("equal rows and cols, or 1"),
        },
    );
    // A page field's value must fit its declared shape.
    check_base(
        "centroid = mean(K, rows)",
        "centroid = K",
        Want {
            line: 10,
            col: 14,
            under: "K",
            message: "this value has shape [pages, 16, 128], which does not fit page field 'centroid'",
            expected: Some("[1, 128]"),
        },
    );
    check_base(
        "max(dot(q, centroid), rows)",
        "max(reshape(q, 3, D), rows)",
        Want {
            line: 13,
            col: 15,
            under: "reshape",
            message: "cannot reshape [1, 4, 128] (512 values) to [3, 128]",
            expected: Some("the same number of values"),
        },
    );
}

#[test]
fn index_phase_without_topk() {
    check_base(
        "  topk(score)\n",
        "",
        Want {
            line: 12,
            col: 1,
            under: "index",
            message: "the index phase must end in a top-k",
            expected: Some("'topk(SCORE)' or 'approx_topk(SCORE)'"),
        },
    );
}

#[test]
fn topk_needs_one_score_per_page() {
    check_base(
        "topk(score)",
        "topk(dot(q, centroid))",
        Want {
            line: 14,
            col: 8,
            under: "dot",
            message: "top-k needs one score per page, but this has shape [pages, 4, 1]",
            expected: Some("shape [pages, 1, 1]"),
        },
    );
    // One number for the whole step is not a per-page score either.
    check_base(
        "topk(score)",
        "topk(npages)",
        Want {
            line: 14,
            col: 8,
            under: "npages",
            message: "top-k needs one score per page, but this has shape [1, 1, 1]",
            expected: Some("shape [pages, 1, 1]"),
        },
    );
}

#[test]
fn nothing_follows_topk() {
    check_base(
        "  topk(score)\n",
        "  topk(score)\n  extra = score\n",
        Want {
            line: 15,
            col: 3,
            under: "extra",
            message: "nothing may follow the top-k on line 14",
            expected: None,
        },
    );
}

#[test]
fn keys_only_in_the_cache_phase() {
    check_base(
        "dot(q, centroid)",
        "dot(q, mean(K, rows))",
        Want {
            line: 13,
            col: 27,
            under: "K",
            message: "'K' is only available in the cache phase",
            expected: Some("a page field that the cache phase computed from it"),
        },
    );
}

#[test]
fn query_only_in_the_index_phase() {
    check_base(
        "centroid = mean(K, rows)",
        "centroid = mean(K, rows) + q",
        Want {
            line: 10,
            col: 30,
            under: "q",
            message: "'q' is only available in the index phase",
            expected: Some("K or V"),
        },
    );
    check_base(
        "centroid = mean(K, rows)",
        "centroid = mean(K, rows) * pos",
        Want {
            line: 10,
            col: 30,
            under: "pos",
            message: "'pos' is only available in the index phase",
            expected: Some("K or V"),
        },
    );
}

#[test]
fn cache_phase_cannot_reduce_over_pages() {
    check_base(
        "mean(K, rows)",
        "mean(K, pages)",
        Want {
            line: 10,
            col: 22,
            under: "pages",
            message: "the cache phase sees one page; it cannot combine pages",
            expected: Some("rows or cols"),
        },
    );
    check_base(
        "mean(K, rows)",
        "softmax(K, pages)",
        Want {
            line: 10,
            col: 25,
            under: "pages",
            message: "the cache phase sees one page; it cannot combine pages",
            expected: Some("rows or cols"),
        },
    );
}

#[test]
fn page_field_never_written() {
    check_base(
        "page centroid[1, D] bf16\n",
        "page centroid[1, D] bf16\npage kmax[1, D]\n",
        Want {
            line: 10,
            col: 1,
            under: "cache",
            message: "the cache phase never writes page field 'kmax'",
            expected: Some("'kmax = ...'"),
        },
    );
    // No cache phase at all.
    let src = edit("cache:\n  centroid = mean(K, rows)\n", "");
    check(
        &src,
        geometry(),
        Want {
            line: 7,
            col: 6,
            under: "centroid",
            message: "page field 'centroid' is declared but there is no cache phase to write it",
            expected: Some("a 'cache:' section"),
        },
    );
}

#[test]
fn page_field_written_twice() {
    check_base(
        "  centroid = mean(K, rows)\n",
        "  centroid = mean(K, rows)\n  centroid = max(K, rows)\n",
        Want {
            line: 11,
            col: 3,
            under: "centroid",
            message: "page field 'centroid' is written twice",
            expected: None,
        },
    );
}

#[test]
fn duplicate_declarations() {
    check_base(
        "page centroid[1, D] bf16\n",
        "page centroid[1, D] bf16\npage centroid[1, D]\n",
        Want {
            line: 8,
            col: 6,
            under: "centroid",
            message: "'centroid' is already declared on line 7",
            expected: None,
        },
    );
    check_base(
        "param recent = 1\n",
        "param recent = 1\nparam sinks = 2\n",
        Want {
            line: 6,
            col: 7,
            under: "sinks",
            message: "'sinks' is already set on line 4",
            expected: None,
        },
    );
    check_base(
        "page centroid[1, D] bf16\n",
        "page centroid[1, D] bf16\nstate centroid[1, 1]\n",
        Want {
            line: 8,
            col: 7,
            under: "centroid",
            message: "'centroid' is already declared on line 7",
            expected: None,
        },
    );
    check_base(
        "  topk(score)\n",
        "  topk(score)\nindex:\n",
        Want {
            line: 15,
            col: 1,
            under: "index",
            message: "the index phase is declared twice",
            expected: None,
        },
    );
    check_base(
        "  score = max(dot(q, centroid), rows)\n",
        "  score = max(dot(q, centroid), rows)\n  score = score + 1\n",
        Want {
            line: 14,
            col: 3,
            under: "score",
            message: "'score' is already assigned in this phase",
            expected: Some("a new name"),
        },
    );
    // Built-in names cannot be declared.
    check_base(
        "page centroid[1, D] bf16\n",
        "page centroid[1, D] bf16\npage K[1, D]\n",
        Want {
            line: 8,
            col: 6,
            under: "K",
            message: "'K' is a built-in name",
            expected: Some("another name"),
        },
    );
}

#[test]
fn budget_zero() {
    let e = check_base(
        "param budget = 8",
        "param budget = 0",
        Want {
            line: 3,
            col: 16,
            under: "0",
            message: "'budget' must be at least 1 page (0 keeps nothing)",
            expected: None,
        },
    );
    assert_eq!(e.diagnostics.len(), 1, "{e}");
}

#[test]
fn recent_zero() {
    check_base(
        "param recent = 1",
        "param recent = 0",
        Want {
            line: 5,
            col: 16,
            under: "0",
            message: "'recent' must be a whole number, at least 1 and at most 1000000000, got 0; the last page holds the current token",
            expected: None,
        },
    );
}

#[test]
fn budget_ratio_above_one() {
    check_base(
        "param budget = 8",
        "param budget_ratio = 1.5",
        Want {
            line: 3,
            col: 22,
            under: "1.5",
            message: "'budget_ratio' must be in (0, 1], got 1.5",
            expected: None,
        },
    );
}

#[test]
fn tolerance_one() {
    check_base(
        "param sinks = 1",
        "param tolerance = 1",
        Want {
            line: 4,
            col: 19,
            under: "1",
            message: "'tolerance' must be in [0, 1), got 1",
            expected: None,
        },
    );
}

#[test]
fn other_bad_settings() {
    check_base(
        "param budget = 8",
        "param budget = 8.5",
        Want {
            line: 3,
            col: 16,
            under: "8.5",
            message: "'budget' must be a whole number, at least 1 and at most 1000000000, got 8.5",
            expected: None,
        },
    );
    check_base(
        "param sinks = 1",
        "param sinks = -1",
        Want {
            line: 4,
            col: 15,
            under: "-1",
            message: "'sinks' must be a whole number, at least 0 and at most 1000000000, got -1",
            expected: None,
        },
    );
    check_base(
        "param budget = 8",
        "param budget = 8, 16",
        Want {
            line: 3,
            col: 16,
            under: "8, 16",
            message: "'budget' takes one value, got 2",
            expected: None,
        },
    );
    check_base(
        "param sinks = 1",
        "param dense_layers = 0, 1.5",
        Want {
            line: 4,
            col: 22,
            under: "0, 1.5",
            message: "'dense_layers' lists layer numbers, got 1.5",
            expected: None,
        },
    );
}

#[test]
fn misspelled_setting_suggests_the_setting() {
    check_base(
        "param budget = 8",
        "param budgt = 8",
        Want {
            line: 3,
            col: 7,
            under: "budgt",
            message: "'budgt' is neither a setting nor used by a phase",
            expected: Some("a setting such as 'budget'"),
        },
    );
    check_base(
        "param recent = 1",
        "param recnet = 1",
        Want {
            line: 5,
            col: 7,
            under: "recnet",
            message: "'recnet' is neither a setting nor used by a phase",
            expected: Some("a setting such as 'recent'"),
        },
    );
}

#[test]
fn unterminated_string() {
    check_base(
        "flow t \"a test flow\"",
        "flow t \"a test flow",
        Want {
            line: 1,
            col: 8,
            under: "\"a test flow",
            message: "unterminated string",
            expected: Some("a closing '\"'"),
        },
    );
}

#[test]
fn unexpected_character() {
    check_base(
        "dot(q, centroid)",
        "dot(q, centroid) @ 2",
        Want {
            line: 13,
            col: 32,
            under: "@",
            message: "unexpected character '@'",
            expected: Some("a name, a number, an operator or '#'"),
        },
    );
    check_base(
        "param sinks = 1",
        "param sinks = 1;",
        Want {
            line: 4,
            col: 16,
            under: ";",
            message: "unexpected character ';'",
            expected: Some("a name, a number, an operator or '#'"),
        },
    );
}

#[test]
fn parse_errors_say_what_was_expected() {
    check_base(
        "param budget = 8",
        "param budget 8",
        Want {
            line: 3,
            col: 14,
            under: "8",
            message: "unexpected number 8",
            expected: Some("'='"),
        },
    );
    check_base(
        "page centroid[1, D] bf16",
        "page centroid[1, D",
        Want {
            line: 7,
            col: 19,
            under: "",
            message: "unexpected end of line",
            expected: Some("']'"),
        },
    );
    check_base(
        "max(dot(q, centroid), rows)",
        "max(dot(q, centroid) rows)",
        Want {
            line: 13,
            col: 32,
            under: "rows",
            message: "unexpected 'rows'",
            expected: Some("',' or ')'"),
        },
    );
    check_base(
        "flow t \"a test flow\"",
        "# no header",
        Want {
            line: 3,
            col: 1,
            under: "param",
            message: "a flow must start with its name",
            expected: Some("'flow NAME'"),
        },
    );
}

#[test]
fn every_broken_line_is_reported_in_order() {
    let src = edit("param sinks = 1", "param sinks = ")
        .replace("mean(K, rows)", "mean(K, rows")
        .replace("dot(q, centroid)", "dot(qq, centroid)");
    let e = errors_for(&src, geometry());
    let places: Vec<(usize, usize)> = e
        .diagnostics
        .iter()
        .map(|d| (d.span.line, d.span.col))
        .collect();
    let mut sorted = places.clone();
    sorted.sort();
    assert_eq!(places, sorted, "{e}");
    let lines: Vec<usize> = places.iter().map(|p| p.0).collect();
    // The parser stops before the checker, so the unknown name on line 13 waits for a fix.
    assert_eq!(lines, vec![4, 10], "{e}");
}

#[test]
fn tabs_keep_the_caret_aligned() {
    let src = edit("  score = max(", "\t\tscore = mx(");
    let e = check(
        &src,
        geometry(),
        Want {
            line: 13,
            col: 11,
            under: "mx",
            message: "unknown operator 'mx'",
            expected: Some("'max'"),
        },
    );
    assert!(
        e.render()
            .contains("13 | \t\tscore = mx(dot(q, centroid), rows)\n   | \t\t        ^^"),
        "{e}"
    );
}

#[test]
fn geometry_with_ungroupable_heads() {
    let g = Geometry {
        heads_q: 10,
        heads_kv: 4,
        ..geometry()
    };
    let e = check(
        BASE,
        g,
        Want {
            line: 1,
            col: 1,
            under: "f",
            message: "bad geometry: 10 query heads cannot be grouped over 4 KV heads (not a multiple)",
            expected: None,
        },
    );
    assert_eq!(e.diagnostics.len(), 1);
}

#[test]
fn geometry_with_bad_page_size() {
    for page_size in [0, 12, 512] {
        let g = Geometry {
            page_size,
            ..geometry()
        };
        check(
            BASE,
            g,
            Want {
                line: 1,
                col: 1,
                under: "f",
                message: &format!(
                    "bad geometry: page_size {page_size} is not a power of two between 1 and 256"
                ),
                expected: None,
            },
        );
    }
    let g = Geometry {
        head_dim: 0,
        ..geometry()
    };
    check(
        BASE,
        g,
        Want {
            line: 1,
            col: 1,
            under: "f",
            message: "bad geometry: heads and head_dim must be at least 1",
            expected: None,
        },
    );
}

fn double_sparse_head_dim_100() -> (&'static str, FlowError) {
    let src = builtin_source("double_sparse").unwrap();
    let g = Geometry {
        head_dim: 100,
        ..geometry()
    };
    (src, errors_for(src, g))
}

#[test]
fn double_sparse_needs_head_dim_divisible_by_8() {
    let src = builtin_source("double_sparse").unwrap();
    let g = Geometry {
        head_dim: 100,
        ..geometry()
    };
    // Both sizes written `D / 8` are reported where they are written.
    check(
        src,
        g,
        Want {
            line: 11,
            col: 21,
            under: "/",
            message: "100 / 8 is not a whole number",
            expected: None,
        },
    );
    let e = errors_for(src, g);
    let lines: Vec<usize> = e
        .diagnostics
        .iter()
        .filter(|d| d.message == "100 / 8 is not a whole number")
        .map(|d| d.span.line)
        .collect();
    assert_eq!(lines, vec![11, 12], "{e}");
    // With head_dim 8 there is one channel and it compiles.
    compile(
        FILE,
        src,
        Geometry {
            head_dim: 8,
            ..geometry()
        },
    )
    .unwrap();
}

// ---------------------------------------------------------------------------------------------
// Misleading messages. These fail while the message stands.

/// A declaration that fails to check (bad size, bad dtype, bad initializer) is dropped by
/// `Checker::declarations` (check/declarations.rs), so every later use reports the declared name as unknown:
/// "unknown name 'centroid'" (with a list of known names that omits it), "'channels' is not a
/// constant", "'st' is not a declared state". The first error is right; the follow-ons are
/// misleading, since each name is declared a few lines up. (Failed `Let`s in a phase are
/// already poisoned this way; declarations are not.)
#[test]
fn failed_declarations_do_not_cascade_into_undeclared_errors() {
    let with_const = |decl: &str| {
        edit(
            "page centroid[1, D] bf16",
            &format!("{decl}\npage centroid[1, D] bf16"),
        )
        .replace("mean(K, rows)", "mean(K, rows) + c")
    };
    let with_state = |decl: &str| {
        edit(
            "page centroid[1, D] bf16",
            &format!("{decl}\npage centroid[1, D] bf16"),
        )
        .replace("  topk(score)", "  save(st, score)\n  topk(score)")
    };
    let cases = [
        edit("page centroid[1, D] bf16", "page centroid[0, D] bf16"),
        edit("page centroid[1, D] bf16", "page centroid[1, D] bf17"),
        with_const("const c[1, D] = values(1)"),
        with_const("const c[1, D / 3] = randn(1)"),
        with_state("state st[0, 1]"),
        double_sparse_head_dim_100().0.to_string(),
    ];
    let mut misleading = Vec::new();
    for (i, src) in cases.iter().enumerate() {
        let g = if i == cases.len() - 1 {
            Geometry {
                head_dim: 100,
                ..geometry()
            }
        } else {
            geometry()
        };
        let e = errors_for(src, g);
        for d in &e.diagnostics[1..] {
            if d.message.contains("unknown name")
                || d.message.contains("is not a constant")
                || d.message.contains("is not a declared state")
            {
                misleading.push(format!("{}\n", d.render(FILE, src)));
            }
        }
    }
    assert!(
        misleading.is_empty(),
        "follow-on errors call declared names undeclared:\n{}",
        misleading.concat()
    );
}

/// Did-you-mean misses the most common typo, two swapped letters, in names of 3 to 5
/// characters: `closest` (check/names.rs) counts a swap as 2 edits (Levenshtein) but allows only
/// `max(len / 3, 1)`, i.e. 1 edit. And a misspelled list setting (`param dense_layer = 1, 2`)
/// gets "'dense_layer' is not a setting, so it must be one number" with no suggestion of
/// 'dense_layers' (`Checker::settings`). The messages are accurate; the hint is missing.
#[test]
fn did_you_mean_catches_swapped_letters_and_list_settings() {
    let cases = [
        (edit("mean(K, rows)", "maen(K, rows)"), "'mean'"),
        (edit("dot(q, centroid)", "dto(q, centroid)"), "'dot'"),
        (edit("topk(score)", "topk(scroe)"), "'score'"),
        (
            edit("param budget = 8", "param dense_layer = 1, 2"),
            "'dense_layers'",
        ),
    ];
    let mut missing = Vec::new();
    for (src, want) in &cases {
        let e = errors_for(src, geometry());
        let d = &e.diagnostics[0];
        if !d.expected.as_deref().is_some_and(|h| h.contains(want)) {
            missing.push(format!("no suggestion of {want}:\n{}", d.render(FILE, src)));
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

/// `Checker::dim_value` (check/declarations.rs) only takes a literal as a size when `n.abs() < 1e12`, so a
/// large whole number is reported as "1000000000000 is not a whole number".
#[test]
fn large_size_is_out_of_range_not_fractional() {
    let src = edit(
        "page centroid[1, D] bf16",
        "page centroid[1000000000000, D] bf16",
    );
    let e = errors_for(&src, geometry());
    let d = &e.diagnostics[0];
    assert!(
        !d.message.contains("not a whole number"),
        "misleading: {}",
        e.render()
    );
    assert!(d.message.contains("out of range"), "{}", e.render());
}

/// `Settings::set` (settings.rs, `count`) rejects counts above 1e9 with "must be a whole number
/// of at least 1, got 10000000000": the value is a whole number of at least 1; the real limit
/// is never named.
#[test]
fn too_large_budget_names_the_limit() {
    let src = edit("param budget = 8", "param budget = 1e10");
    let e = errors_for(&src, geometry());
    let d = &e.diagnostics[0];
    assert!(
        d.message.contains("1000000000") && d.message.contains("most"),
        "the message should name the upper limit: {}",
        e.render()
    );
}

#[test]
fn page_fields_take_the_kv_dtypes_only() {
    for dtype in ["f32", "f16", "bf16", "fp8"] {
        let src = edit(
            "page centroid[1, D] bf16",
            &format!("page centroid[1, D] {dtype}"),
        );
        let flow = compile(FILE, &src, geometry()).unwrap();
        assert_eq!(flow.fields[0].dtype.name(), dtype);
    }
    check_base(
        "page centroid[1, D] bf16",
        "page centroid[1, D] int8",
        Want {
            line: 7,
            col: 21,
            under: "int8",
            message: "unknown dtype 'int8'",
            expected: Some("f32, f16, bf16 or fp8"),
        },
    );
}

/// A value the runner would keep a buffer of is bounded, however it is made.
#[test]
fn values_past_the_size_limit_are_errors() {
    for (big, under) in [
        (
            "  big = fill(1, 16777216, 16777216)\n",
            "fill(1, 16777216, 16777216)",
        ),
        (
            "  big = matmul(transpose(fill(0, 1, 2048)), fill(0, 1, 2048))\n",
            "matmul(transpose(fill(0, 1, 2048)), fill(0, 1, 2048))",
        ),
    ] {
        let src = edit("  topk(score)\n", &format!("{big}  topk(score)\n"));
        let e = errors_for(&src, geometry());
        let text = e.to_string();
        assert!(text.contains("is too large"), "{text}");
        assert!(text.contains("at most 1048576 values"), "{text}");
        assert!(text.contains(under), "{text}");
    }
}

#[test]
fn a_state_is_saved_once() {
    let src = edit(
        "  topk(score)\n",
        "  save(m, load(m) + score)\n  save(m, score)\n  topk(score)\n",
    )
    .replace(
        "page centroid[1, D] bf16",
        "page centroid[1, D] bf16\nstate m[1, 1]",
    );
    let text = errors_for(&src, geometry()).to_string();
    assert!(text.contains("state 'm' is saved twice"), "{text}");
    assert!(text.contains("one save of each state"), "{text}");
}

#[test]
fn a_budget_below_the_always_kept_pages_is_refused() {
    check_base(
        "param budget = 8",
        "param budget = 1",
        Want {
            line: 3,
            col: 7,
            under: "budget",
            message: "'sinks' and 'recent' always keep 2",
            expected: None,
        },
    );
    // Equal is fine: the step keeps the sink and recent pages and none by score.
    compile(
        FILE,
        &edit("param budget = 8", "param budget = 2"),
        geometry(),
    )
    .unwrap();
}

#[test]
fn phases_are_bounded_in_all_not_only_value_by_value() {
    // Each value fits alone; together the cache phase's per-page ones are past the bound.
    let bigs: String = (0..3)
        .map(|i| format!("  big{i} = matmul(transpose(K), K)\n"))
        .collect();
    let src = BASE.replace("cache:\n", &format!("cache:\n{bigs}"));
    let e = errors_for(&src, geometry());
    assert!(
        e.render().contains("per-page values take"),
        "{}",
        e.render()
    );
    // Many step values: each 2^20 numbers, 8 of them past the phase's 2^22.
    let fills: String = (0..8)
        .map(|i| format!("  f{i} = fill({i}, 1024, 1024)\n"))
        .collect();
    let src = BASE.replace("index:\n", &format!("index:\n{fills}"));
    let e = errors_for(&src, geometry());
    assert!(e.render().contains("values take"), "{}", e.render());
}

#[test]
fn long_names_and_long_files_are_refused() {
    let long = "a".repeat(65);
    check_base(
        "  score = max(dot(q, centroid), rows)\n  topk(score)",
        &format!("  {long} = max(dot(q, centroid), rows)\n  topk({long})"),
        Want {
            line: 13,
            col: 3,
            under: &long,
            message: "this name is too long",
            expected: Some("at most 64 characters"),
        },
    );
    let huge = format!("{BASE}{}", "# padding\n".repeat(110_000));
    let e = errors_for(&huge, geometry());
    assert!(
        e.render().contains("this flow is too long"),
        "{}",
        e.render()
    );
}

/// A long line shows the characters around the place, cut with `…`, the caret under the place;
/// control characters show as U+FFFD.
#[test]
fn a_long_line_shows_the_place_alone() {
    let src = format!("flow x\n{}@\n", "a + ".repeat(20_000));
    let e = errors_for(&src, geometry());
    let text = e.diagnostics[0].render("x.flow", &src);
    let rows: Vec<&str> = text.lines().collect();
    assert!(
        rows[2].starts_with("2 | …") && rows[2].ends_with("a + @"),
        "{text}"
    );
    assert!(
        rows[2].chars().count() <= 4 + vortex_flow::diag::SHOWN_CHARS + 2,
        "{text}"
    );
    let caret = rows[3].chars().position(|c| c == '^').unwrap();
    assert_eq!(rows[2].chars().nth(caret), Some('@'), "{text}");
    let src = "flow \0x\n";
    let e = errors_for(src, geometry());
    let text = e.diagnostics[0].render("x.flow", src);
    assert!(text.contains("1 | flow \u{fffd}x\n"), "{text}");
}
