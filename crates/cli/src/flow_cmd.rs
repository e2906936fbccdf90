//! `vortex flow ...`: list, create, check, explain and evaluate flows.

use std::process::ExitCode;

use clap::Subcommand;
use serde_json::json;
use vortex_flow::Geometry;
use vortex_flow::library::{BUILTIN, LoadError, load};
use vortex_flow::runner::FlowRunner;
use vortex_kv::KvDtype;

use crate::GeometryArgs;
use crate::eval_cmd::{FlowEvalArgs, run_flow_eval};
use crate::flow_template::{check_name, template};
use crate::model_args::ModelArgs;

#[derive(Subcommand)]
pub enum FlowCommand {
    /// List the built-in flows.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write a commented template flow to start from (NAME.flow, or --out).
    New {
        /// The flow's name (letters, digits and _).
        name: String,
        /// The file to write.
        #[arg(long)]
        out: Option<String>,
    },
    /// Check flow files (or built-in names) against a geometry; exit 1 if any fails.
    Check {
        /// Flow files or built-in flow names.
        #[arg(required = true)]
        files: Vec<String>,
        #[command(flatten)]
        geometry: GeometryArgs,
        /// Check against this model's real geometry (its heads and head_dim; --page-size still
        /// applies) instead of --heads-q/--heads-kv/--head-dim.
        #[arg(long)]
        model: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a flow's operator graphs, fusion groups and the bytes each phase moves.
    Explain {
        /// A flow file or built-in flow name.
        file: String,
        #[command(flatten)]
        geometry: GeometryArgs,
        /// Storage type of the KV cache (f32, f16, bf16, fp8).
        #[arg(long, default_value = "bf16")]
        kv_dtype: KvDtype,
        /// Print JSON (costs and plan summary).
        #[arg(long)]
        json: bool,
    },
    /// Evaluate a flow on a model against dense: accuracy on a small long-context eval,
    /// attention fidelity and decode speed, in one JSON report.
    Eval(FlowEvalArgs),
}

pub fn run(cmd: FlowCommand) -> Result<ExitCode, String> {
    match cmd {
        FlowCommand::List { json } => {
            let g = Geometry::default();
            let rows: Vec<_> = BUILTIN
                .iter()
                .map(|(name, _)| {
                    let flow = load(name, g).map_err(|e| e.to_string())?;
                    Ok((name.to_string(), flow))
                })
                .collect::<Result<_, String>>()?;
            if json {
                let v: Vec<_> = rows
                    .iter()
                    .map(|(n, f)| json!({"name": n, "about": f.about, "settings": f.settings, "fields": f.fields.iter().map(|x| &x.name).collect::<Vec<_>>(), "index_phase": f.index.is_some()}))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&v).unwrap());
            } else {
                for (n, f) in &rows {
                    let budget = match (f.settings.budget, f.settings.budget_ratio) {
                        (_, Some(r)) if r >= 1.0 => "all pages".to_string(),
                        (Some(b), _) => format!("{b} pages"),
                        (None, Some(r)) => format!("{r} of pages"),
                        (None, None) => "-".into(),
                    };
                    println!("{n:<14} {:<72} budget {budget}", f.about);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        FlowCommand::New { name, out } => {
            check_name(&name)?;
            let path = out.unwrap_or_else(|| format!("{name}.flow"));
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(|e| format!("cannot create {path}: {e}"))?;
            std::io::Write::write_all(&mut file, template(&name).as_bytes())
                .map_err(|e| format!("cannot write {path}: {e}"))?;
            println!("wrote {path}; next: vortex flow check {path} --model smollm2-135m");
            Ok(ExitCode::SUCCESS)
        }
        FlowCommand::Eval(args) => run_flow_eval(args),
        FlowCommand::Check {
            files,
            geometry,
            model,
            json,
        } => {
            let g = match model {
                Some(m) => model_geometry(&m, geometry.page_size)?,
                None => geometry.geometry()?,
            };
            if !json {
                println!(
                    "geometry: {} query heads, {} KV heads, head_dim {}, page {}",
                    g.heads_q, g.heads_kv, g.head_dim, g.page_size
                );
            }
            let mut all_ok = true;
            let mut reports = Vec::new();
            for file in &files {
                match load(file, g) {
                    Ok(flow) => {
                        if json {
                            reports.push(json!({"file": file, "ok": true, "flow": flow.name}));
                        } else {
                            println!("{file}: ok (flow {})", flow.name);
                        }
                    }
                    Err(LoadError::Flow(e)) => {
                        all_ok = false;
                        if json {
                            let errs: Vec<_> = e.diagnostics.iter().map(|d| json!({"line": d.span.line, "col": d.span.col, "message": d.message, "expected": d.expected})).collect();
                            reports.push(json!({"file": file, "ok": false, "errors": errs}));
                        } else {
                            eprint!("{}", e.render());
                        }
                    }
                    Err(LoadError::NotFound(msg)) => {
                        all_ok = false;
                        if json {
                            reports.push(
                                json!({"file": file, "ok": false, "errors": [{"message": msg}]}),
                            );
                        } else {
                            eprintln!("{file}: error: {msg}");
                        }
                    }
                }
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&reports).unwrap());
            }
            Ok(if all_ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        FlowCommand::Explain {
            file,
            geometry,
            kv_dtype,
            json,
        } => {
            let g = geometry.geometry()?;
            let flow = match load(&file, g) {
                Ok(f) => f,
                Err(LoadError::Flow(e)) => {
                    eprint!("{}", e.render());
                    return Ok(ExitCode::from(1));
                }
                Err(e) => return Err(e.to_string()),
            };
            let runner = FlowRunner::new(flow);
            if json {
                let cost = vortex_flow::explain::FlowCost::of(&runner.flow, kv_dtype);
                let stages = |p: Option<&vortex_flow::plan::Plan>| {
                    p.map(|p| p.stages.iter().map(|s| json!({"barriers": s.cross, "step": s.step, "fused_group": s.group, "tile_pages": s.tile_pages})).collect::<Vec<_>>())
                };
                let v = json!({
                    "flow": runner.flow.name,
                    "settings": runner.flow.settings,
                    "cost": cost,
                    "cache_stages": stages(runner.cache_plan()),
                    "index_stages": stages(runner.index_plan()),
                    "gpu_index": vortex_cuda::model::index_kernel(&runner.flow),
                });
                println!("{}", serde_json::to_string_pretty(&v).unwrap());
            } else {
                print!("{}", vortex_flow::explain::explain(&runner, kv_dtype));
                println!(
                    "\non a GPU (--device cuda), the index phase: {}",
                    vortex_cuda::model::index_kernel(&runner.flow)
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The attention geometry of a model (loaded to read its configuration).
fn model_geometry(model: &str, page_size: usize) -> Result<Geometry, String> {
    let args = ModelArgs {
        model: model.to_string(),
        page_size,
        kv_dtype_name: "bf16".into(),
        weight_dtype: "bf16".into(),
        prefill_chunk: 512,
        threads: None,
    };
    let loaded = args.load()?;
    let g = args.geometry(&loaded.model.config);
    g.validate().map(|_| g)
}
