//! Results grouped per task x length x flow, with each flow's gap to dense, as Markdown tables
//! and as JSON.

use serde::Serialize;

use crate::fidelity::Fidelity;
use crate::runner::{EvalResults, SpeedResult};
use crate::tasks::Task;

/// Accuracy and fidelity of one flow on one task at one length.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// A task name, or `all` for every task together.
    pub task: String,
    pub length: usize,
    pub flow: String,
    pub samples: usize,
    pub correct: usize,
    pub accuracy: f64,
    /// Accuracy minus dense accuracy on the same samples (percentage points / 100).
    pub gap_vs_dense: f64,
    pub fidelity: Fidelity,
}

/// The cells of `results`, in the order of `tasks`, `lengths` and `flows` (dense first), then
/// one `all` cell per length and flow.
pub fn cells(
    results: &EvalResults,
    tasks: &[Task],
    lengths: &[usize],
    flows: &[String],
) -> Vec<Cell> {
    let mut out = Vec::new();
    let names: Vec<Option<Task>> = tasks.iter().map(|&t| Some(t)).chain([None]).collect();
    for task in names {
        for &length in lengths {
            let mut dense_acc = None;
            for flow in flows {
                let rows: Vec<_> = results
                    .samples
                    .iter()
                    .filter(|r| {
                        r.length == length && &r.flow == flow && task.is_none_or(|t| r.task == t)
                    })
                    .collect();
                if rows.is_empty() {
                    continue;
                }
                let correct = rows.iter().filter(|r| r.correct).count();
                let accuracy = correct as f64 / rows.len() as f64;
                let dense = *dense_acc.get_or_insert(accuracy);
                let mut fidelity = Fidelity::default();
                for r in &rows {
                    fidelity.merge(&r.fidelity);
                }
                out.push(Cell {
                    task: task.map_or("all", |t| t.name()).to_string(),
                    length,
                    flow: flow.clone(),
                    samples: rows.len(),
                    correct,
                    accuracy,
                    gap_vs_dense: accuracy - dense,
                    fidelity,
                });
            }
        }
    }
    out
}

/// `8192` as `8k`, `1000` as `1000`.
pub fn short_len(n: usize) -> String {
    if n.is_multiple_of(1024) {
        format!("{}k", n / 1024)
    } else {
        n.to_string()
    }
}

fn table(
    title: &str,
    lengths: &[usize],
    flows: &[String],
    cell: &dyn Fn(&str, usize) -> Option<String>,
) -> String {
    let mut s = format!("| {title} |");
    for &l in lengths {
        s += &format!(" {} |", short_len(l));
    }
    s += "\n|---|";
    s += &"---|".repeat(lengths.len());
    s.push('\n');
    for f in flows {
        s += &format!("| {f} |");
        for &l in lengths {
            s += &format!(" {} |", cell(f, l).unwrap_or_else(|| "-".into()));
        }
        s.push('\n');
    }
    s
}

/// Accuracy per task (and all tasks), flows down and lengths across: dense first, every other
/// flow with its gap to dense in points.
pub fn accuracy_tables(cells: &[Cell], lengths: &[usize], flows: &[String]) -> String {
    let mut tasks: Vec<&str> = Vec::new();
    for c in cells {
        if !tasks.contains(&c.task.as_str()) {
            tasks.push(&c.task);
        }
    }
    let mut s = String::new();
    for task in tasks {
        let find = |f: &str, l: usize| {
            cells
                .iter()
                .find(|c| c.task == task && c.flow == f && c.length == l)
        };
        let n = cells
            .iter()
            .find(|c| c.task == task)
            .map_or(0, |c| c.samples);
        s += &format!("\nAccuracy (%), {task}, {n} samples per cell; (gap to dense in points)\n\n");
        s += &table(task, lengths, flows, &|f, l| {
            find(f, l).map(|c| {
                if f == flows[0] {
                    format!("{:.0}", 100.0 * c.accuracy)
                } else {
                    format!("{:.0} ({:+.0})", 100.0 * c.accuracy, 100.0 * c.gap_vs_dense)
                }
            })
        });
    }
    s
}

/// Fidelity over all tasks: mass recall / top-k recall / relative output error.
pub fn fidelity_table(cells: &[Cell], lengths: &[usize], flows: &[String]) -> String {
    let mut s = String::from(
        "\nAttention fidelity, all tasks: mass recall / top-k page recall / relative output error\n\n",
    );
    s += &table("flow", lengths, flows, &|f, l| {
        cells
            .iter()
            .find(|c| c.task == "all" && c.flow == f && c.length == l)
            .filter(|c| c.fidelity.rows > 0)
            .map(|c| {
                format!(
                    "{:.3} / {:.3} / {:.3}",
                    c.fidelity.mass_recall, c.fidelity.topk_recall, c.fidelity.rel_error
                )
            })
    });
    s
}

/// Decode tokens/s per flow and length, with the ratio to dense.
pub fn speed_table(speed: &[SpeedResult], lengths: &[usize], flows: &[String]) -> String {
    if speed.is_empty() {
        return String::new();
    }
    let mut s = String::from("\nDecode tokens/s (x dense)\n\n");
    let find = |f: &str, l: usize| speed.iter().find(|r| r.flow == f && r.length == l);
    s += &table("flow", lengths, flows, &|f, l| {
        let r = find(f, l)?;
        let dense = find(&flows[0], l).map_or(0.0, |d| d.tokens_per_s);
        Some(format!(
            "{:.1} ({:.2}x)",
            r.tokens_per_s,
            r.tokens_per_s / dense.max(1e-9)
        ))
    });
    s
}

/// The tasks, lengths and flows of saved results, in the order they ran (dense first).
pub fn axes(results: &EvalResults) -> (Vec<Task>, Vec<usize>, Vec<String>) {
    let (mut tasks, mut lengths, mut flows) = (Vec::new(), Vec::new(), Vec::new());
    for r in &results.samples {
        if !tasks.contains(&r.task) {
            tasks.push(r.task);
        }
        if !lengths.contains(&r.length) {
            lengths.push(r.length);
        }
        if !flows.contains(&r.flow) {
            flows.push(r.flow.clone());
        }
    }
    (tasks, lengths, flows)
}
