//! The kernel sources compile with NVRTC for Hopper, for several geometries. Needs only NVRTC
//! (no GPU); skipped with a message where NVRTC is absent.

#[path = "common/pass_flows.rs"]
mod pass_flows;

use std::io::Write;

use vortex_cuda::block_topk::{self, Summary};
use vortex_cuda::compile::{compile, compile_all};
use vortex_cuda::{
    PoolDtype, attention, double_sparse, fp8_weights, h2o, kv_pool, layer_kernels, libs, logprobs,
    page_mass, prefill, prefill_shape, sampling, topk,
};
use vortex_kv::KvGeometry;

/// Whether NVRTC loads; where it does not, says that `test` is skipped.
fn nvrtc_or_skip(test: &str) -> bool {
    match libs::load_nvrtc() {
        Ok(_) => true,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {e}");
            false
        }
    }
}

#[test]
fn kernels_compile_for_sm90() {
    if !nvrtc_or_skip("kernels_compile_for_sm90") {
        return;
    }
    let mut jobs = Vec::new();
    for (kv_heads, dim, page, group, warps) in [
        (8, 128, 16, 4, 4),
        (8, 128, 16, 4, 8),
        (2, 64, 1, 1, 4),
        (4, 256, 64, 2, 4),
        (1, 32, 8, 8, 2),
        (2, 16, 16, 2, 4),
        // SmolLM2-135M: 9 query heads over 3 KV heads of 64.
        (3, 64, 16, 3, 4),
        // 7 and 8 query heads per KV head: bf16 pages on the tensor cores too.
        (4, 128, 16, 7, 8),
        (2, 128, 16, 8, 4),
        // 16 (Llama-3-405B): the prefill's queries in 64 KiB of dynamic shared memory.
        (2, 128, 16, 16, 4),
    ] {
        let label = format!("{dim}/{page}/{group}/{warps}");
        let g = KvGeometry::new(kv_heads, dim, page).unwrap();
        let pool_specs = [PoolDtype::Bf16, PoolDtype::Fp8].into_iter().flat_map(|d| {
            [
                attention::module_spec(
                    g,
                    d,
                    group,
                    attention::Variant {
                        warps,
                        min_blocks: 2,
                        prefetch: warps % 2 == 0,
                    },
                ),
                kv_pool::module_spec(g, d),
                page_mass::module_spec(g, d, group, (9, 0)).unwrap(),
                layer_kernels::module_spec(dim, page, d),
                prefill::module_spec(
                    g,
                    d,
                    group,
                    // Hopper's 227 KiB of shared memory a block, 228 an SM.
                    prefill::on_tensor_cores(dim, group, (9, 0))
                        .then(|| prefill_shape::MmaShape::choose(dim, d, 227 << 10, 228 << 10))
                        .flatten(),
                ),
            ]
        });
        for spec in pool_specs
            .chain([
                topk::module_spec(),
                sampling::module_spec(),
                logprobs::module_spec(),
            ])
            .chain(
                [
                    Summary::Centroid,
                    Summary::CentroidFp8,
                    Summary::MinMax,
                    Summary::MinMaxFp8,
                ]
                .map(|s| block_topk::module_spec(g, kv_heads * group, s)),
            )
            .chain([h2o::module_spec(g, kv_heads * group)])
            .filter(|s| !matches!(s.name, "block_topk.cu" | "h2o.cu") || 32 % (dim / 8) == 0)
            .filter(|s| {
                s.name != "prefill.cu"
                    || prefill::fits(dim, group)
                    || prefill::on_tensor_cores(dim, group, (9, 0))
            })
        {
            jobs.push((format!("{label} {}", spec.name), spec.text()));
        }
    }
    compile_every(&jobs);
}

/// Compiles each `(label, text)` for Hopper, on every core: each must give a binary.
fn compile_every(jobs: &[(String, String)]) {
    let refs: Vec<(&str, &str)> = jobs.iter().map(|(l, t)| (l.as_str(), t.as_str())).collect();
    for ((label, _), bin) in jobs.iter().zip(compile_all(&refs, "sm_90")) {
        let bin = bin.unwrap_or_else(|e| panic!("{label}: {e}"));
        assert!(bin.len() > 1000, "{label}");
    }
}

/// The page masses' CUDA-core kernel for the geometries a Hopper scores on the tensor cores, as
/// devices without them build it: fp8 pools before compute capability 8.9, bf16 before 8.0.
#[test]
fn cuda_core_page_masses_compile_before_their_tensor_cores() {
    if !nvrtc_or_skip("cuda_core_page_masses_compile_before_their_tensor_cores") {
        return;
    }
    let g = KvGeometry::new(8, 128, 16).unwrap();
    for (dtype, capability, arch) in [
        (PoolDtype::Fp8, (8, 6), "sm_86"),
        (PoolDtype::Bf16, (7, 5), "sm_75"),
    ] {
        for group in [1, 4, 8] {
            assert!(!page_mass::tensor_core_masses(g, dtype, group, capability));
            let spec = page_mass::module_spec(g, dtype, group, capability).unwrap();
            let bin = compile(spec.name, &spec.text(), arch)
                .unwrap_or_else(|e| panic!("{dtype} {group} {arch}: {e}"));
            assert!(bin.len() > 1000);
        }
    }
}

/// The fp8 weight kernels (quantization, dequantization, the decode step's products).
#[test]
fn fp8_weight_kernels_compile_for_sm90() {
    if !nvrtc_or_skip("fp8_weight_kernels_compile_for_sm90") {
        return;
    }
    for warps in [2, 4, 8] {
        let shape = fp8_weights::Fp8Shape {
            warps: [warps, warps],
            depth: 3,
            tall_warps: 0,
            blocks_per_sm: 2,
            clusters: true,
        };
        let spec = fp8_weights::module_spec(shape);
        let bin = compile(spec.name, &spec.text(), "sm_90").unwrap_or_else(|e| panic!("{e}"));
        assert!(bin.len() > 1000);
    }
    // Before compute capability 8.9 the weights widen to f16 without the conversion instruction.
    let spec = fp8_weights::module_spec(fp8_weights::Fp8Shape::default());
    for arch in ["sm_90", "sm_80"] {
        let bin = compile(spec.name, &spec.text(), arch).unwrap_or_else(|e| panic!("{e}"));
        assert!(bin.len() > 1000);
    }
}

/// Every built-in flow, and flows whose index phase runs in passes, compile for three
/// geometries.
#[test]
fn generated_flows_compile_for_sm90() {
    if !nvrtc_or_skip("generated_flows_compile_for_sm90") {
        return;
    }
    let mut tensor_core_index = false;
    let mut jobs = Vec::new();
    for g in [
        vortex_flow::Geometry::default(),
        vortex_flow::Geometry {
            heads_q: 8,
            heads_kv: 2,
            head_dim: 64,
            page_size: 8,
        },
        vortex_flow::Geometry {
            heads_q: 16,
            heads_kv: 2,
            head_dim: 128,
            page_size: 16,
        },
    ] {
        let tests = [
            ("spread", pass_flows::SPREAD),
            ("decay", pass_flows::DECAY),
            ("halves_fp8", pass_flows::HALVES_FP8),
            ("six_fp8", pass_flows::SIX_FP8),
            ("previous", pass_flows::PREVIOUS),
            ("wide", pass_flows::WIDE),
            ("reductions", pass_flows::REDUCTIONS),
            ("products", pass_flows::PRODUCTS),
            ("sums", pass_flows::SUMS),
            ("crowded", pass_flows::CROWDED),
            ("thread_cache", pass_flows::THREAD_CACHE),
            ("five_states", pass_flows::FIVE_STATES),
        ];
        let flows = vortex_flow::library::BUILTIN
            .iter()
            .map(|(name, _)| (*name, vortex_flow::library::load(name, g).unwrap()))
            .chain(
                tests.map(|(name, src)| (name, vortex_flow::compile("t.flow", src, g).unwrap())),
            );
        for (name, flow) in flows {
            if vortex_cuda::codegen::unsupported(&flow).is_some() {
                continue;
            }
            let geom = KvGeometry::new(g.heads_kv, g.head_dim, g.page_size).unwrap();
            let text = vortex_cuda::generated::source(&flow).unwrap();
            for dtype in [PoolDtype::Bf16, PoolDtype::Fp8] {
                let spec = vortex_cuda::generated::module_spec(&flow, geom, dtype, &text);
                jobs.push((format!("{name} ({dtype})"), spec.text()));
            }
            if let Some(channels) = double_sparse::kept_channels(&flow, (9, 0)) {
                let spec = double_sparse::module_spec(&flow, channels.len());
                jobs.push((format!("{name} on the tensor cores"), spec.text()));
                tensor_core_index = true;
            }
        }
    }
    compile_every(&jobs);
    assert!(
        tensor_core_index,
        "double_sparse's tensor-core index was not compiled"
    );
}
