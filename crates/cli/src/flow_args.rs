//! Command-line choice of a flow and its settings, shared by the commands that run a model.

use clap::Args;
use vortex_flow::library::{LoadError, load};
use vortex_flow::{Flow, Geometry, Settings};

#[derive(Args, Clone, Debug, Default)]
pub struct FlowArgs {
    /// Sparse-attention flow: a built-in name (see `vortex flow list`) or a flow file.
    #[arg(long, default_value = "dense")]
    pub flow: String,
    /// Pages kept per decode step, sinks and recent pages included.
    #[arg(long)]
    pub budget: Option<usize>,
    /// Pages kept as a share of the sequence's pages, in (0, 1].
    #[arg(long)]
    pub budget_ratio: Option<f64>,
    /// First pages always kept.
    #[arg(long)]
    pub sinks: Option<usize>,
    /// Last pages always kept (at least 1).
    #[arg(long)]
    pub recent: Option<usize>,
    /// Layers that always attend densely (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub dense_layers: Option<Vec<usize>>,
    /// Sequences shorter than this many tokens attend densely.
    #[arg(long)]
    pub min_context: Option<usize>,
    /// Share of the exact top pages approximate top-k may miss, in [0, 1).
    #[arg(long)]
    pub tolerance: Option<f64>,
}

impl FlowArgs {
    /// The flow checked for `geometry` and a model of `layers` layers, with the command line's
    /// settings applied.
    pub fn load(&self, geometry: Geometry, layers: usize) -> Result<Flow, String> {
        // A bad shape (e.g. --page-size) is the command line's fault, not the flow's.
        geometry
            .validate()
            .map_err(|e| format!("the attention shape: {e}"))?;
        let mut flow = load(&self.flow, geometry).map_err(|e| match e {
            LoadError::Flow(e) => e.render(),
            other => other.to_string(),
        })?;
        self.apply(&mut flow.settings)?;
        // The flow file's own dense layers too, so that a server does not start only to refuse
        // every request.
        flow.settings.check_layers(layers)?;
        Ok(flow)
    }

    /// Overrides `settings` with the values given on the command line.
    pub fn apply(&self, settings: &mut Settings) -> Result<(), String> {
        let mut set = |name: &str, values: Vec<f64>| settings.set(name, &values);
        if let Some(b) = self.budget {
            set("budget", vec![b as f64])?;
        }
        if let Some(r) = self.budget_ratio {
            set("budget_ratio", vec![r])?;
        }
        if let Some(s) = self.sinks {
            set("sinks", vec![s as f64])?;
        }
        if let Some(r) = self.recent {
            set("recent", vec![r as f64])?;
        }
        if let Some(l) = &self.dense_layers {
            set("dense_layers", l.iter().map(|&x| x as f64).collect())?;
        }
        if let Some(m) = self.min_context {
            set("min_context", vec![m as f64])?;
        }
        if let Some(t) = self.tolerance {
            set("tolerance", vec![t])?;
        }
        settings.check()
    }
}
