//! `vortex eval`: long-context accuracy of sparse flows against dense on one model, with
//! attention fidelity and decode speed; and the evaluation behind `vortex flow eval`.

use std::io::Write;
use std::process::ExitCode;

use clap::Args;
use serde_json::json;
use vortex_eval::report::{accuracy_tables, cells, fidelity_table, short_len, speed_table};
use vortex_eval::runner::{EvalPlan, EvalResults, FlowSpec, MAX_SAMPLES, Progress, run};
use vortex_eval::spec::{Budget, flow_specs, parse_tokens};
use vortex_eval::tasks::Task;
use vortex_flow::library::{BUILTIN, builtin_source};
use vortex_model::loader::LoadedModel;

use crate::model_args::ModelArgs;

#[derive(Args)]
pub struct EvalArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub run: RunArgs,
    /// Flows to compare with dense: built-in names or flow files (`all`: every built-in).
    #[arg(long, value_delimiter = ',', default_value = "all")]
    pub flows: Vec<String>,
    /// Page budgets of the sparse flows: shares of the context (1/8, 0.125) or tokens (1k).
    #[arg(long, value_delimiter = ',', default_value = "1/8,1/16")]
    pub budget: Vec<String>,
    /// Write every cell, sample and speed measurement as JSON to this file.
    #[arg(long)]
    pub json: Option<String>,
    /// Write an SVG plot of accuracy against length to this file.
    #[arg(long)]
    pub plot: Option<String>,
    /// Print the tables (and --plot) of a JSON file an earlier run wrote, also of a run stopped
    /// early, instead of running anything.
    #[arg(long, conflicts_with = "json")]
    pub report_from: Option<String>,
}

/// What to run, shared by `vortex eval` and `vortex flow eval`.
#[derive(Args, Clone)]
pub struct RunArgs {
    /// Tasks: passkey, needle, multikey, vartrack.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "passkey,needle,multikey,vartrack"
    )]
    pub tasks: Vec<String>,
    /// Context lengths (prompt and answer together), e.g. 2k,4k,8k.
    #[arg(long, value_delimiter = ',', default_value = "2k,4k,8k")]
    pub lengths: Vec<String>,
    /// Samples per task and length.
    #[arg(long, default_value_t = 5)]
    pub samples: usize,
    /// Seed of the generated samples.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Decode steps of each answer on which attention fidelity is measured (0: none).
    #[arg(long, default_value_t = 2)]
    pub fidelity_steps: usize,
    /// Fidelity is measured in every this-many-th layer.
    #[arg(long, default_value_t = 1)]
    pub fidelity_layer_stride: usize,
    /// Tokens decoded per flow at each length to time decoding (0: no speed measurement).
    #[arg(long, default_value_t = 16)]
    pub speed_tokens: usize,
}

impl RunArgs {
    /// The counts that a model is not needed to check.
    fn check(&self) -> Result<(), String> {
        if self.samples == 0 || self.samples > MAX_SAMPLES {
            return Err(format!("--samples must be 1 to {MAX_SAMPLES}"));
        }
        if self.fidelity_layer_stride == 0 {
            return Err("--fidelity-layer-stride must be at least 1".into());
        }
        Ok(())
    }
}

/// A finished evaluation with what describes it.
pub struct Evaluated {
    pub loaded: LoadedModel,
    pub plan: EvalPlan,
    pub results: EvalResults,
    pub budgets: Vec<String>,
}

impl Evaluated {
    pub fn labels(&self) -> Vec<String> {
        self.plan.flows.iter().map(|f| f.label.clone()).collect()
    }

    pub fn cells(&self) -> Vec<vortex_eval::report::Cell> {
        cells(
            &self.results,
            &self.plan.tasks,
            &self.plan.lengths,
            &self.labels(),
        )
    }
}

/// Loads the model, checks everything, and runs the evaluation with progress on stderr.
pub fn evaluate(
    model: &ModelArgs,
    run_args: &RunArgs,
    flows: &[String],
    budgets: &[String],
    partial: Option<&str>,
) -> Result<Evaluated, String> {
    let tasks = run_args
        .tasks
        .iter()
        .map(|t| Task::parse(t))
        .collect::<Result<Vec<_>, _>>()?;
    let lengths = run_args
        .lengths
        .iter()
        .map(|l| parse_tokens(l))
        .collect::<Result<Vec<_>, _>>()?;
    let budget_specs = budgets
        .iter()
        .map(|b| Budget::parse(b))
        .collect::<Result<Vec<_>, _>>()?;
    // Unknown flows fail before the model loads; flow files are checked against its geometry.
    for f in flows {
        let f = f.trim();
        if f != "all" && builtin_source(f).is_none() && !std::path::Path::new(f).is_file() {
            let names: Vec<&str> = BUILTIN.iter().map(|(n, _)| *n).collect();
            return Err(format!(
                "unknown flow '{f}': neither a built-in flow ({}, or all) nor a flow file",
                names.join(", ")
            ));
        }
    }
    run_args.check()?;
    let kv_dtype = model.kv_dtype()?;
    let mut loaded = model.load()?;
    if model.weight_dtype == "fp8" {
        // The values a GPU with fp8 weights multiplies by, so that their cost in accuracy can be
        // measured here (at four bytes a weight: no faster).
        loaded.model = vortex_model::gpu_values::fp8_model(&loaded.model);
        eprintln!("weights: the GPU's fp8 values (e4m3, a scale an output row), multiplied in f32");
    }
    loaded.model = model.for_cpu(loaded.model);
    let cfg = &loaded.model.config;
    if let Some(&l) = lengths.iter().find(|&&l| l > cfg.max_positions) {
        return Err(format!(
            "length {} ({l} tokens) is beyond {}'s context of {} tokens",
            short_len(l),
            loaded.name,
            cfg.max_positions
        ));
    }
    let specs: Vec<FlowSpec> = flow_specs(flows, &budget_specs, model.geometry(cfg))?;
    let plan = EvalPlan {
        tasks,
        lengths,
        flows: specs,
        samples: run_args.samples,
        seed: run_args.seed,
        fidelity_steps: run_args.fidelity_steps,
        fidelity_layer_stride: run_args.fidelity_layer_stride,
        speed_tokens: run_args.speed_tokens,
        page_size: model.page_size,
        kv_dtype,
        prefill_chunk: model.prefill_chunk,
        stop_tokens: loaded.stop_tokens.clone(),
    };
    plan.validate(&loaded.model)?;
    eprintln!(
        "{}: {} tasks x {} lengths x {} samples, {} flow settings (dense first)",
        loaded.name,
        plan.tasks.len(),
        plan.lengths.len(),
        plan.samples,
        plan.flows.len()
    );
    let mut err = std::io::stderr();
    // Results so far, written to `partial` after every sample so that a long run stopped early
    // keeps what it measured.
    let mut so_far = EvalResults::default();
    let labels: Vec<String> = plan.flows.iter().map(|f| f.label.clone()).collect();
    let save = |so_far: &EvalResults| {
        if let Some(path) = partial {
            let v = json!({
                "model": loaded.name,
                "partial": true,
                "cells": cells(so_far, &plan.tasks, &plan.lengths, &labels),
                "speed": so_far.speed,
                "samples": so_far.samples,
            });
            let _ = std::fs::write(path, serde_json::to_string_pretty(&v).unwrap());
        }
    };
    let results = run(&loaded.model, &loaded.tokenizer, &plan, &mut |p| match p {
        Progress::Prefilled {
            done,
            total,
            task,
            length,
            index,
            prompt_tokens,
            secs,
        } => {
            let _ = write!(
                err,
                "\n[{done}/{total}] {} {} #{index}: {prompt_tokens} tokens prefilled in {secs:.1}s; answers ",
                task.name(),
                short_len(length)
            );
            let _ = err.flush();
        }
        Progress::Answered(r) => {
            let _ = write!(err, "{}", if r.correct { '+' } else { '.' });
            let _ = err.flush();
            so_far.samples.push(r.clone());
            if so_far.samples.len().is_multiple_of(labels.len()) {
                save(&so_far);
            }
        }
        Progress::Timed(t) => so_far.speed.push(t.clone()),
    })?;
    eprintln!();
    Ok(Evaluated {
        loaded,
        plan,
        results,
        budgets: budgets.to_vec(),
    })
}

pub fn run_eval(args: EvalArgs) -> Result<ExitCode, String> {
    if let Some(path) = &args.report_from {
        return report_from(path, args.plot.as_deref());
    }
    // Fail on unwritable outputs before spending time on the evaluation.
    for path in [&args.json, &args.plot].into_iter().flatten() {
        check_writable(path)?;
    }
    let ev = evaluate(
        &args.model,
        &args.run,
        &args.flows,
        &args.budget,
        args.json.as_deref(),
    )?;
    let labels = ev.labels();
    let cells = ev.cells();
    let lengths = &ev.plan.lengths;
    print!("{}", accuracy_tables(&cells, lengths, &labels));
    if ev.plan.fidelity_steps > 0 {
        print!("{}", fidelity_table(&cells, lengths, &labels));
    }
    print!("{}", speed_table(&ev.results.speed, lengths, &labels));
    if let Some(path) = &args.json {
        let v = json!({
            "model": ev.loaded.name,
            "config": config_json(&ev, &args.model),
            "cells": cells,
            "speed": ev.results.speed,
            "samples": ev.results.samples,
        });
        std::fs::write(path, serde_json::to_string_pretty(&v).unwrap())
            .map_err(|e| format!("cannot write {path}: {e}"))?;
        eprintln!("wrote {path}");
    }
    if let Some(path) = &args.plot {
        let title = format!(
            "{}: accuracy by context length ({} samples per point)",
            ev.loaded.name, ev.plan.samples
        );
        let svg = vortex_eval::plot::svg(&title, &cells, lengths, &labels);
        std::fs::write(path, svg).map_err(|e| format!("cannot write {path}: {e}"))?;
        eprintln!("wrote {path}");
    }
    Ok(ExitCode::SUCCESS)
}

/// An error now if `path` cannot be written; a file this creates to find out is removed.
fn check_writable(path: &str) -> Result<(), String> {
    let existed = std::path::Path::new(path).exists();
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("cannot write {path}: {e}"))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Bytes of a report `--report-from` reads at most (a report of a large run is a few MiB).
const MAX_REPORT_BYTES: u64 = 256 << 20;

/// Tables and plot of the results saved in `path`.
fn report_from(path: &str, plot: Option<&str>) -> Result<ExitCode, String> {
    use std::io::Read;
    // Read no further than a report can be: the path may be a device or a pipe.
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_REPORT_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("cannot read {path}: {e}"))?;
    if bytes.len() as u64 > MAX_REPORT_BYTES {
        return Err(format!(
            "{path} is larger than {} MiB: not a report `vortex eval --json` writes",
            MAX_REPORT_BYTES >> 20
        ));
    }
    let text = String::from_utf8(bytes).map_err(|_| format!("{path} is not UTF-8 text"))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{path} is not JSON: {e}"))?;
    if v.get("samples").is_none() {
        return Err(format!(
            "{path} does not hold eval results: no \"samples\" key (`vortex eval --json` writes one)"
        ));
    }
    let results: EvalResults = serde_json::from_value(
        json!({"samples": v["samples"], "speed": v.get("speed").unwrap_or(&json!([]))}),
    )
    .map_err(|e| format!("{path} does not hold eval results: {e}"))?;
    if results.samples.is_empty() {
        return Err(format!("{path} holds no samples"));
    }
    let (tasks, lengths, labels) = vortex_eval::report::axes(&results);
    let cells = cells(&results, &tasks, &lengths, &labels);
    let model = v["model"].as_str().unwrap_or("model");
    if v["partial"] == true {
        println!("{path}: results of a run that had not finished");
    }
    print!("{}", accuracy_tables(&cells, &lengths, &labels));
    print!("{}", fidelity_table(&cells, &lengths, &labels));
    print!("{}", speed_table(&results.speed, &lengths, &labels));
    if let Some(out) = plot {
        let title = format!("{model}: accuracy by context length");
        let svg = vortex_eval::plot::svg(&title, &cells, &lengths, &labels);
        std::fs::write(out, svg).map_err(|e| format!("cannot write {out}: {e}"))?;
        eprintln!("wrote {out}");
    }
    Ok(ExitCode::SUCCESS)
}

pub fn config_json(ev: &Evaluated, model: &ModelArgs) -> serde_json::Value {
    json!({
        "tasks": ev.plan.tasks,
        "lengths": ev.plan.lengths,
        "flows": ev.labels(),
        "budgets": ev.budgets,
        "samples": ev.plan.samples,
        "seed": ev.plan.seed,
        "fidelity_steps": ev.plan.fidelity_steps,
        "fidelity_layer_stride": ev.plan.fidelity_layer_stride,
        "speed_tokens": ev.plan.speed_tokens,
        "page_size": model.page_size,
        "kv_dtype": format!("{:?}", ev.plan.kv_dtype),
        "weights": match model.weight_dtype.as_str() {
            "fp8" => "fp8 values (the GPU's)",
            "q8_0" => "float matrices quantized to Q8_0 at load",
            _ => "the file's own",
        },
        "threads": rayon::current_num_threads(),
    })
}

/// `vortex flow eval`: a small evaluation of one flow against dense.
#[derive(Args)]
pub struct FlowEvalArgs {
    /// The flow file (or a built-in name).
    pub file: String,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Tasks (see `vortex eval`).
    #[arg(long, value_delimiter = ',', default_value = "passkey,needle,multikey")]
    pub tasks: Vec<String>,
    /// Context lengths.
    #[arg(long, value_delimiter = ',', default_value = "2k")]
    pub lengths: Vec<String>,
    /// Samples per task and length.
    #[arg(long, default_value_t = 3)]
    pub samples: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Page budgets: shares of the context (1/8) or tokens (1k).
    #[arg(long, value_delimiter = ',', default_value = "1/8")]
    pub budget: Vec<String>,
    /// Tokens decoded per flow to time decoding.
    #[arg(long, default_value_t = 32)]
    pub speed_tokens: usize,
    /// Where to write the JSON report (default: the flow file's name with .eval.json).
    #[arg(long)]
    pub out: Option<String>,
}

pub fn run_flow_eval(args: FlowEvalArgs) -> Result<ExitCode, String> {
    let out = args.out.clone().unwrap_or_else(|| {
        let stem = std::path::Path::new(&args.file)
            .file_stem()
            .map_or("flow".into(), |s| s.to_string_lossy().into_owned());
        format!("{stem}.eval.json")
    });
    // The summary compares decode speed with dense's.
    if args.speed_tokens == 0 {
        return Err(
            "--speed-tokens must be at least 1: the summary compares the flow's decode \
             speed with dense's (`vortex eval --speed-tokens 0` leaves timing out)"
                .into(),
        );
    }
    check_writable(&out)?;
    let run_args = RunArgs {
        tasks: args.tasks.clone(),
        lengths: args.lengths.clone(),
        samples: args.samples,
        seed: args.seed,
        fidelity_steps: 2,
        fidelity_layer_stride: 1,
        speed_tokens: args.speed_tokens,
    };
    let ev = evaluate(
        &args.model,
        &run_args,
        std::slice::from_ref(&args.file),
        &args.budget,
        Some(&out),
    )?;
    let cells = ev.cells();
    let labels = ev.labels();
    let all = |flow: &str| -> Vec<&vortex_eval::report::Cell> {
        cells
            .iter()
            .filter(|c| c.task == "all" && c.flow == flow)
            .collect()
    };
    let mean = |cs: &[&vortex_eval::report::Cell],
                f: &dyn Fn(&vortex_eval::report::Cell) -> f64| {
        let n: usize = cs.iter().map(|c| c.samples).sum();
        cs.iter().map(|c| f(c) * c.samples as f64).sum::<f64>() / n.max(1) as f64
    };
    let dense_cells = all(&labels[0]);
    let dense_acc = mean(&dense_cells, &|c| c.accuracy);
    let speed_of = |flow: &str| -> Vec<f64> {
        ev.results
            .speed
            .iter()
            .filter(|s| s.flow == flow)
            .map(|s| s.tokens_per_s)
            .collect()
    };
    let avg = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let dense_tps = avg(&speed_of(&labels[0]));
    let mut rows = Vec::new();
    if labels.len() == 1 {
        // The file is dense itself: the baseline alone.
        println!(
            "{}: accuracy {:.0}%; decode {dense_tps:.1} tokens/s (the baseline other flows \
             compare with)",
            labels[0],
            100.0 * dense_acc
        );
    }
    for label in &labels[1..] {
        let cs = all(label);
        let mut fid = vortex_eval::fidelity::Fidelity::default();
        for c in &cs {
            fid.merge(&c.fidelity);
        }
        let acc = mean(&cs, &|c| c.accuracy);
        let tps = avg(&speed_of(label));
        println!(
            "{label}: accuracy {:.0}% (dense {:.0}%, gap {:+.0} points); mass recall {:.3}, top-k recall {:.3}, output error {:.3}; decode {tps:.1} tokens/s ({:.2}x dense)",
            100.0 * acc,
            100.0 * dense_acc,
            100.0 * (acc - dense_acc),
            fid.mass_recall,
            fid.topk_recall,
            fid.rel_error,
            tps / dense_tps.max(1e-9)
        );
        rows.push(json!({
            "flow": label,
            "accuracy": acc,
            "dense_accuracy": dense_acc,
            "gap_vs_dense": acc - dense_acc,
            "fidelity": fid,
            "decode_tokens_per_s": tps,
            "dense_decode_tokens_per_s": dense_tps,
            "speedup_vs_dense": tps / dense_tps.max(1e-9),
        }));
    }
    let v = json!({
        "flow_file": args.file,
        "model": ev.loaded.name,
        "config": config_json(&ev, &args.model),
        "summary": rows,
        "cells": cells,
        "speed": ev.results.speed,
        "samples": ev.results.samples,
    });
    std::fs::write(&out, serde_json::to_string_pretty(&v).unwrap())
        .map_err(|e| format!("cannot write {out}: {e}"))?;
    eprintln!("wrote {out}");
    Ok(ExitCode::SUCCESS)
}
