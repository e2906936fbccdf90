//! What to evaluate, from text: context lengths (`2k`), budgets (`1/8`, `0.1`, `512`) and the
//! list of flows, each flow at each budget, dense first.

use vortex_flow::library::{BUILTIN, LoadError, load};
use vortex_flow::{Geometry, Settings};

use crate::runner::FlowSpec;

/// A token count: `512`, `4k` (4096), `1.5k`.
pub fn parse_tokens(s: &str) -> Result<usize, String> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = match t.strip_suffix('k') {
        Some(n) => (n, 1024.0),
        None => (t.as_str(), 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a token count (e.g. 512, 4k)"))?;
    let n = v * mult;
    if !(n >= 1.0 && n.fract() == 0.0 && n <= 1e9) {
        return Err(format!("'{s}' is not a whole, positive number of tokens"));
    }
    Ok(n as usize)
}

/// How many pages a sparse step keeps.
#[derive(Debug, Clone, PartialEq)]
pub enum Budget {
    /// A share of the sequence's pages, written as given (`1/8`).
    Ratio(f64, String),
    /// A number of tokens, rounded up to whole pages.
    Tokens(usize),
}

impl Budget {
    /// `1/8` or `0.125` (a share of the context), or `512` / `1k` (tokens).
    pub fn parse(s: &str) -> Result<Budget, String> {
        let t = s.trim();
        let ratio = if let Some((a, b)) = t.split_once('/') {
            let (a, b): (f64, f64) = (
                a.trim().parse().map_err(|_| bad_budget(s))?,
                b.trim().parse().map_err(|_| bad_budget(s))?,
            );
            Some(a / b)
        } else if t.contains('.') {
            Some(t.parse::<f64>().map_err(|_| bad_budget(s))?)
        } else {
            None
        };
        match ratio {
            Some(r) if r > 0.0 && r <= 1.0 => Ok(Budget::Ratio(r, t.to_string())),
            Some(_) => Err(format!(
                "budget '{s}' must be a share of the context in (0, 1]"
            )),
            None => parse_tokens(t)
                .map(Budget::Tokens)
                .map_err(|_| bad_budget(s)),
        }
    }

    pub fn label(&self) -> String {
        match self {
            Budget::Ratio(_, l) => l.clone(),
            Budget::Tokens(t) => format!("{t} tokens"),
        }
    }

    /// Sets `settings` to keep this budget (and nothing larger from the flow's own `budget`).
    pub fn apply(&self, settings: &mut Settings, page_size: usize) {
        match self {
            Budget::Ratio(r, _) => {
                settings.budget = None;
                settings.budget_ratio = Some(*r);
            }
            Budget::Tokens(t) => {
                settings.budget = Some(t.div_ceil(page_size).max(1));
                settings.budget_ratio = None;
            }
        }
    }
}

fn bad_budget(s: &str) -> String {
    format!("'{s}' is not a budget: give a share of the context (1/8, 0.125) or tokens (512, 1k)")
}

/// Each flow at each budget, checked for `geometry`; `dense` (at full budget) comes first
/// whether listed or not. `all` stands for every built-in flow.
pub fn flow_specs(
    names: &[String],
    budgets: &[Budget],
    geometry: Geometry,
) -> Result<Vec<FlowSpec>, String> {
    let mut list: Vec<String> = Vec::new();
    for n in names {
        let n = n.trim();
        if n.is_empty() {
            continue;
        }
        if n == "all" {
            list.extend(BUILTIN.iter().map(|(b, _)| b.to_string()));
        } else {
            list.push(n.to_string());
        }
    }
    list.retain(|n| n != "dense");
    // Each flow once, in the order first named.
    let mut seen = std::collections::HashSet::new();
    list.retain(|n| seen.insert(n.clone()));
    list.insert(0, "dense".into());
    if list.len() > 1 && budgets.is_empty() {
        return Err("give at least one budget for the sparse flows".into());
    }
    let mut specs = Vec::new();
    for (source, name) in list.iter().enumerate() {
        let flow = load(name, geometry).map_err(|e| match e {
            LoadError::Flow(e) => e.render(),
            other => other.to_string(),
        })?;
        if source == 0 {
            specs.push(FlowSpec {
                label: "dense".into(),
                flow,
                source,
            });
            continue;
        }
        for b in budgets {
            let mut f = flow.clone();
            b.apply(&mut f.settings, geometry.page_size);
            let label = format!("{} {}", f.name, b.label());
            f.settings.check().map_err(|e| format!("{label}: {e}"))?;
            if specs.iter().any(|s: &FlowSpec| s.label == label) {
                return Err(format!(
                    "'{label}' would be two rows: flows need distinct names (a file may not reuse a built-in's) and budgets distinct values"
                ));
            }
            specs.push(FlowSpec {
                label,
                flow: f,
                source,
            });
        }
    }
    Ok(specs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tokens_and_budgets() {
        assert_eq!(parse_tokens("4k"), Ok(4096));
        assert_eq!(parse_tokens("512"), Ok(512));
        assert!(parse_tokens("4x").is_err());
        assert!(parse_tokens("0").is_err());
        assert_eq!(Budget::parse("1/8"), Ok(Budget::Ratio(0.125, "1/8".into())));
        assert_eq!(Budget::parse("1k"), Ok(Budget::Tokens(1024)));
        assert!(Budget::parse("3/2").is_err());
        assert!(Budget::parse("abc").is_err());
    }

    #[test]
    fn dense_first_and_unknown_flows_rejected() {
        let g = Geometry::default();
        let b = [
            Budget::parse("1/8").unwrap(),
            Budget::parse("1/16").unwrap(),
        ];
        let s = flow_specs(&["quest".into(), "dense".into()], &b, g).unwrap();
        let labels: Vec<&str> = s.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels, ["dense", "quest 1/8", "quest 1/16"]);
        assert_eq!(s[1].flow.settings.budget, None);
        assert_eq!(s[1].flow.settings.budget_ratio, Some(0.125));
        // Named twice, apart: one row each.
        let s = flow_specs(&["quest".into(), "h2o".into(), "quest".into()], &b[..1], g).unwrap();
        assert_eq!(s.len(), 3);
        let twice = [b[0].clone(), b[0].clone()];
        assert!(flow_specs(&["quest".into()], &twice, g).is_err());
        let err = flow_specs(&["nosuch".into()], &b, g).unwrap_err();
        assert!(
            err.contains("nosuch") && err.contains("block_topk"),
            "{err}"
        );
        // A budget of tokens below the sink and recent pages, as everywhere else.
        let small = [Budget::parse("16").unwrap()];
        let err = flow_specs(&["quest".into()], &small, g).unwrap_err();
        assert!(
            err.contains("quest 16 tokens") && err.contains("always keep 2"),
            "{err}"
        );
        assert!(flow_specs(&["quest".into()], &[Budget::parse("32").unwrap()], g).is_ok());
    }
}
