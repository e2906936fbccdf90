//! Bytes of page summaries a CPU server keeps for a model's flows, with summaries in every
//! layer (`KvState::new`) and in the layers that select only (`KvState::for_model`).
//!
//! cargo run --release -p vortex-model --example summary_bytes -- MODEL.gguf [PAGES] [FLOWS]

use std::process::ExitCode;

use vortex_flow::Geometry;
use vortex_flow::runner::FlowRunner;
use vortex_kv::{KvCache, KvDtype, KvGeometry};
use vortex_model::model::KvState;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("summary_bytes: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args
        .first()
        .ok_or("usage: summary_bytes MODEL.gguf [PAGES] [FLOWS]")?;
    let pages: usize = match args.get(1) {
        Some(p) => p.parse().map_err(|e| format!("PAGES {p}: {e}"))?,
        None => 14_563,
    };
    let flows = args
        .get(2)
        .map_or("block_topk,quest,quest_fp8", String::as_str);
    let loaded =
        vortex_model::loader::load(std::path::Path::new(path)).map_err(|e| e.to_string())?;
    let c = &loaded.model.config;
    let g = Geometry {
        heads_q: c.heads_q,
        heads_kv: c.heads_kv,
        head_dim: c.head_dim,
        page_size: 16,
    };
    let geom = KvGeometry::new(c.heads_kv, c.head_dim, 16).map_err(|e| e.to_string())?;
    for name in flows.split(',') {
        let flow = vortex_flow::library::load(name, g).map_err(|e| e.to_string())?;
        let cache = || KvCache::new(geom, KvDtype::Bf16, c.layers, pages);
        let every = KvState::new(cache(), FlowRunner::new(flow.clone()));
        let selecting = KvState::for_model(cache(), FlowRunner::new(flow), c);
        println!(
            "{name}: {} bytes in every layer, {} in the layers that select",
            every.summary_bytes(),
            selecting.summary_bytes()
        );
    }
    Ok(())
}
