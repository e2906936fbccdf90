//! Writes the full NVRTC text of the decode-path modules (the built-in flows' generated ones
//! too) for model geometries into a folder,
//! one `.cu` file each, so their register use can be read without a GPU
//! (`scripts/kernel_spills.sh`).
//!
//!   cargo run -p vortex-cuda --example kernel_texts -- DIR [KV_HEADS:HEAD_DIM:PAGE:GROUP ...] [FLOW_FILE ...]
//!
//! Flow files (`.flow`) are generated beside the built-in flows.

use std::process::ExitCode;

use vortex_cuda::attention::module_spec_with;
use vortex_cuda::block_topk::{self, Summary};
use vortex_cuda::compile::ModuleSpec;
use vortex_cuda::step_attention::{CHUNKED, ONE_ROUND};
use vortex_cuda::{PoolDtype, h2o, kv_pool, layer_kernels, page_mass, prefill, prefill_shape};
use vortex_kv::KvGeometry;

/// (KV heads, head_dim, page size, query heads per KV head) of the models the project runs:
/// Qwen3-8B, Qwen3-1.7B, Gemma 3 270M/1B, Gemma 3 4B, SmolLM2-135M, Qwen2.5-Coder-0.5B and
/// Qwen2.5-Coder-1.5B.
const MODELS: [(usize, usize, usize, usize); 8] = [
    (8, 128, 16, 4),
    (8, 128, 16, 2),
    (1, 256, 16, 4),
    (4, 256, 16, 2),
    (3, 64, 16, 3),
    (2, 64, 16, 7),
    (2, 128, 16, 6),
    (8, 128, 16, 1),
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first() else {
        eprintln!("usage: kernel_texts DIR [KV_HEADS:HEAD_DIM:PAGE:GROUP ...] [FLOW_FILE ...]");
        return ExitCode::from(2);
    };
    let (flows, shapes): (Vec<&String>, Vec<&String>) =
        args[1..].iter().partition(|a| a.ends_with(".flow"));
    let geometries = if shapes.is_empty() {
        MODELS.to_vec()
    } else {
        match shapes
            .iter()
            .map(|a| parse(a))
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(g) => g,
            Err(e) => {
                eprintln!("kernel_texts: {e}");
                return ExitCode::from(2);
            }
        }
    };
    let mut sources = Vec::new();
    for path in flows {
        match std::fs::read_to_string(path) {
            Ok(text) => sources.push((path.clone(), text)),
            Err(e) => {
                eprintln!("kernel_texts: {path}: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if let Err(e) = write_all(dir, &geometries, &sources) {
        eprintln!("kernel_texts: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// Most KV heads, and query heads per KV head, a geometry here may have.
const MAX_HEADS: usize = 1024;

/// `KV_HEADS:HEAD_DIM:PAGE:GROUP`, for a geometry the decode kernels take: head_dim 8 to 256 in
/// powers of two (a row in 16-byte pieces over at most a warp's lanes), a page size the pool
/// takes.
fn parse(arg: &str) -> Result<(usize, usize, usize, usize), String> {
    let form = || format!("{arg}: not KV_HEADS:HEAD_DIM:PAGE:GROUP");
    let n: Vec<usize> = arg
        .split(':')
        .map(|x| x.parse().map_err(|_| form()))
        .collect::<Result<_, _>>()?;
    let [kv, dim, page, group] = n[..] else {
        return Err(form());
    };
    if !(1..=MAX_HEADS).contains(&kv) || !(1..=MAX_HEADS).contains(&group) {
        return Err(format!(
            "{arg}: KV_HEADS and GROUP must be 1 to {MAX_HEADS}"
        ));
    }
    if ![8, 16, 32, 64, 128, 256].contains(&dim) {
        return Err(format!(
            "{arg}: HEAD_DIM must be 8, 16, 32, 64, 128 or 256 (what decode attention takes)"
        ));
    }
    KvGeometry::new(kv, dim, page).map_err(|e| format!("{arg}: {e}"))?;
    Ok((kv, dim, page, group))
}

/// Writes every module for each geometry; `flows` are (path, text) of flow files.
fn write_all(
    dir: &str,
    geometries: &[(usize, usize, usize, usize)],
    flows: &[(String, String)],
) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{dir}: {e}"))?;
    for &(kv, dim, page, group) in geometries {
        let g = KvGeometry::new(kv, dim, page)
            .map_err(|e| format!("{kv}:{dim}:{page}:{group}: {e}"))?;
        let mut specs: Vec<(String, ModuleSpec)> = Vec::new();
        for dtype in [PoolDtype::Bf16, PoolDtype::Fp8] {
            let tag = format!("{kv}x{dim}p{page}g{group}_{dtype}");
            for (name, v) in [("chunked", CHUNKED), ("prefetch", ONE_ROUND)] {
                for (window, skips) in [("", false), ("_window", true)] {
                    specs.push((
                        format!("{tag}_attention_{name}{window}"),
                        module_spec_with(g, dtype, group, v, skips),
                    ));
                }
            }
            specs.push((format!("{tag}_kv_pool"), kv_pool::module_spec(g, dtype)));
            if let Ok(s) = page_mass::module_spec(g, dtype, group, (9, 0)) {
                specs.push((format!("{tag}_page_mass"), s));
            }
            specs.push((
                format!("{tag}_layer"),
                layer_kernels::module_spec(dim, page, dtype),
            ));
            let shape = prefill::on_tensor_cores(dim, group, (9, 0))
                .then(|| prefill_shape::MmaShape::choose(dim, dtype, 227 << 10, 228 << 10))
                .flatten();
            if prefill::fits(dim, group) || shape.is_some() {
                specs.push((
                    format!("{tag}_prefill"),
                    prefill::module_spec(g, dtype, group, shape),
                ));
            }
        }
        let tag = format!("{kv}x{dim}g{group}");
        for (name, s) in [
            ("block_topk", Summary::Centroid),
            ("block_topk_fp8", Summary::CentroidFp8),
            ("quest", Summary::MinMax),
            ("quest_fp8", Summary::MinMaxFp8),
        ] {
            specs.push((
                format!("{tag}_{name}"),
                block_topk::module_spec(g, kv * group, s),
            ));
        }
        specs.push((format!("{tag}_h2o"), h2o::module_spec(g, kv * group)));
        for (name, spec) in specs {
            let path = format!("{dir}/{name}.cu");
            std::fs::write(&path, spec.text()).map_err(|e| format!("{path}: {e}"))?;
        }
        // The built-in flows and the flow files given, whose cache and index phases are
        // generated.
        let fg = vortex_flow::Geometry {
            heads_q: kv * group,
            heads_kv: kv,
            head_dim: dim,
            page_size: page,
        };
        let builtin = vortex_flow::library::BUILTIN.iter().map(|(name, _)| {
            let flow = vortex_flow::library::load(name, fg).map_err(|e| e.to_string());
            (name.to_string(), flow)
        });
        let own = flows.iter().map(|(path, text)| {
            let name = std::path::Path::new(path)
                .file_stem()
                .map_or(path.clone(), |s| s.to_string_lossy().into_owned());
            (
                name,
                vortex_flow::compile(path, text, fg).map_err(|e| e.to_string()),
            )
        });
        for (name, flow) in builtin.chain(own) {
            let skip = |e: String| {
                eprintln!("kernel_texts: {kv}:{dim}:{page}:{group}: flow {name} left out: {e}")
            };
            let flow = match flow {
                Ok(flow) => flow,
                Err(e) => {
                    skip(e);
                    continue;
                }
            };
            if vortex_cuda::codegen::unsupported(&flow).is_some() {
                continue;
            }
            let text = match vortex_cuda::generated::source(&flow) {
                Ok(text) => text,
                Err(e) => {
                    skip(e.to_string());
                    continue;
                }
            };
            for dtype in [PoolDtype::Bf16, PoolDtype::Fp8] {
                let spec = vortex_cuda::generated::module_spec(&flow, g, dtype, &text);
                let path = format!("{dir}/{kv}x{dim}p{page}g{group}_{dtype}_flow_{name}.cu");
                std::fs::write(&path, spec.text()).map_err(|e| format!("{path}: {e}"))?;
            }
        }
    }
    Ok(())
}
