//! The commented starting point that `vortex flow new NAME` writes.

/// A working flow (mean-key scoring) with every section explained; `NAME` becomes the name.
const TEMPLATE: &str = r#"# NAME: a sparse-attention flow. The language is described in docs/FLOWS.md.
#
# A flow runs for ONE sequence and ONE KV head (with its G query heads). It has two phases:
#   cache:  once per completed KV page; sees K and V of that page ([P, D] each) and must
#           assign every `page` field below.
#   index:  at every decode step; sees q ([G, D]), the page fields (one block per page),
#           `pos` and `npages`; must end with topk(score), score having one value per page.
# The engine then keeps `sinks` first pages, `recent` last pages and the best-scoring pages in
# between, up to `budget` pages (or `budget_ratio` of the pages, whichever is larger).
#
# Shapes are [n, rows, cols]; n is `pages` (per page) or 1 (same for every page).
# D = head_dim, G = query heads per KV head, P = page_size.
#
# Check it:    vortex flow check NAME.flow --model smollm2-135m
# Explain it:  vortex flow explain NAME.flow
# Evaluate it: vortex flow eval NAME.flow --model smollm2-135m

flow NAME "One line saying what this flow does"

# Settings (every one has a default; the command line can override them).
param budget = 64          # pages kept per step, sinks and recent included
param sinks = 1            # first pages, always kept
param recent = 1           # last pages, always kept (at least 1: it holds the current token)

# Per-page summaries written by the cache phase: page FIELD[rows, cols] f32|f16|bf16|fp8
page centroid[1, D] bf16

# Optional: constants shared by all requests, e.g.
#   const proj[D, 16] = randn(7)
# and per-request state kept across steps (load/save in the index phase), e.g.
#   state seen[1, 1]

cache:
  # The mean key of the page stands for the page.
  centroid = mean(K, rows)

index:
  # [pages, G, 1]: each query head against each page's centroid; keep the best head.
  s = dot(q, centroid)
  score = max(s, rows)
  topk(score)
"#;

/// The template for a flow called `name`.
pub fn template(name: &str) -> String {
    TEMPLATE.replace("NAME", name)
}

/// Why `name` cannot be a flow name, if it cannot: a letter or `_`, then letters, digits or
/// `_`, within the flow checker's limits on a name.
pub fn check_name(name: &str) -> Result<(), String> {
    let not_a_name = |why: String| Err(format!("'{name}' is not a flow name: {why}"));
    if !valid_name(name) {
        return not_a_name("use letters, digits and _, starting with a letter".into());
    }
    match vortex_flow::lexer::lex(name) {
        Ok(_) => Ok(()),
        Err(d) => not_a_name(match d.expected {
            Some(e) => format!("{} ({e})", d.message),
            None => d.message,
        }),
    }
}

/// Whether `name` is a letter or `_`, then letters, digits or `_`.
fn valid_name(name: &str) -> bool {
    let mut c = name.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_checks_for_real_geometries() {
        for g in [
            vortex_flow::Geometry::default(),
            vortex_flow::Geometry {
                heads_q: 9,
                heads_kv: 3,
                head_dim: 64,
                page_size: 16,
            },
        ] {
            let f = vortex_flow::compile("t.flow", &template("my_flow"), g)
                .unwrap_or_else(|e| panic!("{}", e.render()));
            assert_eq!(f.name, "my_flow");
        }
        assert!(
            valid_name("my_flow2") && !valid_name("2x") && !valid_name("a-b") && !valid_name("")
        );
        assert_eq!(check_name("my_flow"), Ok(()));
        let err = check_name(&"a".repeat(1000)).unwrap_err();
        assert!(err.contains("this name is too long (at most"), "{err}");
    }
}
