//! The settings around a flow: page budget, always-kept pages, dense layers, thresholds.

use serde::Serialize;

/// How many pages a sparse step keeps and which steps stay dense.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Settings {
    /// Pages kept per step, sinks and recent pages included.
    pub budget: Option<usize>,
    /// Pages kept as a share of the sequence's pages; with `budget` too, the larger applies.
    pub budget_ratio: Option<f64>,
    /// First pages always kept (attention sinks).
    pub sinks: usize,
    /// Last pages always kept (recent window; includes the page being written).
    pub recent: usize,
    /// Layers that always attend densely.
    pub dense_layers: Vec<usize>,
    /// Sequences shorter than this many tokens attend densely.
    pub min_context: usize,
    /// Approximate top-k may miss up to this share of the exact top pages (0 = exact).
    pub tolerance: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            budget: Some(64),
            budget_ratio: None,
            sinks: 1,
            recent: 1,
            dense_layers: vec![],
            min_context: 0,
            tolerance: 0.0,
        }
    }
}

/// The names `param` may set; any other name declares a scalar for the phases to use.
pub const SETTING_NAMES: [&str; 7] = [
    "budget",
    "budget_ratio",
    "sinks",
    "recent",
    "dense_layers",
    "min_context",
    "tolerance",
];

impl Settings {
    /// Sets one setting from its written values; the error says what is allowed.
    pub fn set(&mut self, name: &str, values: &[f64]) -> Result<(), String> {
        let one = || -> Result<f64, String> {
            match values {
                [v] => Ok(*v),
                _ => Err(format!("'{name}' takes one value, got {}", values.len())),
            }
        };
        let count = |min: f64| -> Result<usize, String> {
            let v = one()?;
            if v.fract() != 0.0 || v < min || v > 1e9 {
                return Err(format!(
                    "'{name}' must be a whole number, at least {min} and at most 1000000000, got {v}"
                ));
            }
            Ok(v as usize)
        };
        match name {
            "budget" => {
                let v = one()?;
                if v == 0.0 {
                    return Err("'budget' must be at least 1 page (0 keeps nothing)".into());
                }
                self.budget = Some(count(1.0)?);
            }
            "budget_ratio" => {
                let v = one()?;
                if !(v > 0.0 && v <= 1.0) {
                    return Err(format!("'budget_ratio' must be in (0, 1], got {v}"));
                }
                self.budget_ratio = Some(v);
            }
            "sinks" => self.sinks = count(0.0)?,
            "recent" => {
                self.recent =
                    count(1.0).map_err(|e| format!("{e}; the last page holds the current token"))?
            }
            "min_context" => self.min_context = count(0.0)?,
            "tolerance" => {
                let v = one()?;
                if !(0.0..1.0).contains(&v) {
                    return Err(format!("'tolerance' must be in [0, 1), got {v}"));
                }
                self.tolerance = v;
            }
            "dense_layers" => {
                let mut layers = Vec::new();
                for &v in values {
                    if v.fract() != 0.0 || !(0.0..1e6).contains(&v) {
                        return Err(format!("'dense_layers' lists layer numbers, got {v}"));
                    }
                    layers.push(v as usize);
                }
                layers.sort_unstable();
                layers.dedup();
                self.dense_layers = layers;
            }
            _ => {
                return Err(format!(
                    "unknown setting '{name}' (settings are {})",
                    SETTING_NAMES.join(", ")
                ));
            }
        }
        Ok(())
    }

    /// Whether every dense layer is one of a model's `layers`.
    pub fn check_layers(&self, layers: usize) -> Result<(), String> {
        match self.dense_layers.iter().find(|&&l| l >= layers) {
            Some(l) => Err(format!(
                "dense layer {l} does not exist; the model has {layers} layers"
            )),
            None => Ok(()),
        }
    }

    /// The settings together: a budget below the sink and recent pages is refused, as those
    /// are always kept and it would keep more than it says.
    pub fn check(&self) -> Result<(), String> {
        let always = self.sinks.saturating_add(self.recent);
        if let Some(b) = self.budget
            && self.budget_ratio.is_none()
            && always > b
        {
            let pages = if b == 1 { "page" } else { "pages" };
            return Err(format!(
                "'budget' is {b} {pages}, but 'sinks' and 'recent' always keep {always}: raise \
                 the budget or lower them"
            ));
        }
        Ok(())
    }

    /// The recall tolerance as the top-k kernels take it: rounded toward zero, so that the
    /// recall they promise is never below the one asked for.
    pub fn tolerance_f32(&self) -> f32 {
        let t = self.tolerance as f32;
        if f64::from(t) > self.tolerance {
            t.next_down()
        } else {
            t
        }
    }

    /// Pages a step keeps for a sequence of `pages` pages.
    pub fn budget_pages(&self, pages: usize) -> usize {
        let by_count = self.budget.unwrap_or(0);
        let by_ratio = self
            .budget_ratio
            .map_or(0, |r| (r * pages as f64).ceil() as usize);
        by_count.max(by_ratio).max(1)
    }

    /// Whether this step attends to every page.
    pub fn is_dense(&self, layer: usize, tokens: usize, pages: usize) -> bool {
        tokens < self.min_context
            || self.dense_layers.contains(&layer)
            || self.budget_pages(pages) >= pages
    }
}

#[cfg(test)]
mod tests {
    use super::Settings;

    #[test]
    fn tolerance_rounds_toward_zero() {
        let mut s = Settings::default();
        for t in [0.0999999999, 0.1, 0.03, 0.5, 1e-9] {
            s.tolerance = t;
            let f = s.tolerance_f32();
            assert!(f64::from(f) <= t, "{t} -> {f}");
            assert!(f64::from(f.next_up()) > t, "{t} -> {f}");
        }
    }
}
