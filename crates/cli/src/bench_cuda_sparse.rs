//! The sparse steps on the GPU in `vortex bench attention --device cuda` (`block_topk`, `quest`):
//! the fused index phase (page scores from the summaries, top-k, sparse page table) and paged
//! attention over the selected pages, against its bytes floor and the dense step of the batch.

use std::time::Instant;

use serde::Serialize;
use vortex_cuda::block_topk::{BlockTopk, Summary, sel_rows};
use vortex_cuda::step_attention::StepAttention;
use vortex_cuda::timing::{median, time_runs};
use vortex_cuda::{CudaSlice, DecodeAttention, Device, DeviceTable, GpuLayerKv, KvKernels};
use vortex_flow::Geometry;
use vortex_flow::library::load;

/// Recall tolerance of the approximate index phase that is timed beside the exact one.
const TOLERANCE: f32 = 0.03;

/// One sparse-step measurement.
#[derive(Serialize)]
pub struct SparseRow {
    pub flow: String,
    pub batch: usize,
    pub context: usize,
    pub budget_tokens: usize,
    /// The attention kernel's variant.
    pub warps: usize,
    pub min_blocks: usize,
    pub prefetch: bool,
    pub default: bool,
    pub cache_phase_us: f64,
    pub host_us: f64,
    /// The fused index phase with the flow's exact top-k.
    pub index_us: f64,
    /// The same with the approximate top-k at [`TOLERANCE`].
    pub index_approx_us: f64,
    pub step_us: f64,
    pub step_approx_us: f64,
    /// The exact step with the attention launched as a dependent of the index phase.
    pub step_dependent_us: f64,
    pub bytes: usize,
    pub floor_us: f64,
    pub over_floor: f64,
    pub dense_us: f64,
    pub speedup: f64,
}

/// What one configuration of the dense bench already set up.
pub struct Setup<'a> {
    pub dev: &'a Device,
    pub kv_kernels: &'a KvKernels,
    pub layer: &'a GpuLayerKv,
    pub dense: &'a DeviceTable,
    pub q: &'a CudaSlice<f32>,
    pub out: &'a mut CudaSlice<f32>,
    pub lens: &'a [usize],
    pub geometry: Geometry,
    pub copy_gbps: f64,
    pub dense_us: f64,
    pub iters: usize,
    /// Chooses the build a model step would use.
    pub step_attn: &'a StepAttention,
}

pub fn sparse_step(
    s: &mut Setup,
    attn: &mut DecodeAttention,
    flow_name: &str,
    budget_tokens: usize,
) -> Result<SparseRow, String> {
    let e = |e: vortex_cuda::CudaError| e.to_string();
    let g = s.geometry;
    let (dev, layer) = (s.dev, s.layer);
    let kv = layer.geom;
    let summary = Summary::for_flow(flow_name)
        .ok_or_else(|| format!("no GPU index phase for flow '{flow_name}'"))?;
    let flow = load(flow_name, g).map_err(|e| e.to_string())?;
    let mut settings = flow.settings.clone();
    settings.budget = Some(budget_tokens.div_ceil(g.page_size));
    settings.budget_ratio = None;
    // Cache phase: summaries of every complete page (timed once; it runs as pages fill).
    let complete: Vec<u32> = {
        let t = s.dense.download(dev).map_err(e)?;
        (0..t.rows())
            .flat_map(|r| {
                let full = s.lens[r] / g.page_size;
                t.pages(r)[..full].to_vec()
            })
            .collect()
    };
    let mut topk = BlockTopk::new(dev, kv, g.heads_q, summary).map_err(e)?;
    let mut fields = Vec::new();
    for _ in 0..summary.fields() {
        fields.push(topk.alloc_field(dev, layer.num_pages).map_err(e)?);
    }
    let ms = time_runs(dev, 1, 1, || match &mut fields[..] {
        [c] => s.kv_kernels.page_means(dev, layer, &complete, c),
        [a, b] => s.kv_kernels.page_minmax(dev, layer, &complete, a, b),
        _ => unreachable!("one or two summary fields"),
    })
    .map_err(e)?;
    let cache_phase_us = ms[0] * 1e3;
    let t0 = Instant::now();
    let per_seq: Vec<&vortex_flow::Settings> = s.lens.iter().map(|_| &settings).collect();
    let rows = sel_rows(&s.dense.row_pages, &per_seq, 0, s.lens, kv.kv_heads);
    let mut sparse = topk.prepare(dev, s.dense, &rows, None).map_err(e)?;
    attn.config.waves = 0;
    let default = s.step_attn.choose(&sparse).0 == attn.variant;
    let plan = attn.plan(&sparse);
    let host_us = t0.elapsed().as_secs_f64() * 1e6;
    attn.load_plan(dev, &plan).map_err(e)?;
    let scale = 1.0 / (g.head_dim as f32).sqrt();
    let refs: Vec<&_> = fields.iter().collect();
    // Median microseconds of the index phase alone, or with the attention after it.
    let mut time = |topk: &mut BlockTopk, attn: &mut DecodeAttention, with_attention: bool| {
        let ms = time_runs(dev, 3, s.iters, || {
            topk.launch(
                dev,
                s.dense,
                &refs,
                layer.num_pages,
                s.q,
                &rows,
                &mut sparse,
            )?;
            if with_attention {
                attn.launch(dev, layer, &sparse, s.q, scale, s.out)?;
            }
            Ok(())
        })
        .map_err(e)?;
        Ok::<f64, String>(median(&ms) * 1e3)
    };
    let mut times = [0.0f64; 4];
    for (j, tolerance) in [0.0, TOLERANCE].into_iter().enumerate() {
        topk.tolerance = tolerance;
        times[2 * j] = time(&mut topk, attn, false)?;
        times[2 * j + 1] = time(&mut topk, attn, true)?;
    }
    topk.tolerance = 0.0;
    attn.dependent_launch = true;
    let dependent = time(&mut topk, attn, true);
    attn.dependent_launch = false;
    let step_dependent_us = dependent?;
    // Bytes a step must move: K and V of the selected pages, the candidates' summaries and
    // page ids, the selected indices (the fused index phase keeps the scores on chip).
    let page_kv = 2 * g.page_size * g.head_dim * 2;
    let bytes: usize = rows
        .iter()
        .map(|r| {
            let kept = (r.sinks + r.k + r.recent) as usize;
            let cand = if r.k > 0 {
                (r.pages - r.sinks - r.recent) as usize
            } else {
                0
            };
            kept * (page_kv + 4) + cand * (summary.fields() * g.head_dim * 2 + 4)
        })
        .sum();
    let step_us = times[1];
    let floor_us = bytes as f64 / (s.copy_gbps * 1e9) * 1e6;
    Ok(SparseRow {
        flow: flow_name.to_string(),
        batch: s.lens.len(),
        context: s.lens.iter().copied().max().unwrap_or(0),
        budget_tokens,
        warps: attn.variant.warps,
        min_blocks: attn.variant.min_blocks,
        prefetch: attn.variant.prefetch,
        default,
        cache_phase_us,
        host_us,
        index_us: times[0],
        index_approx_us: times[2],
        step_us,
        step_approx_us: times[3],
        step_dependent_us,
        bytes,
        floor_us,
        over_floor: step_us / floor_us,
        dense_us: s.dense_us,
        speedup: s.dense_us / step_us,
    })
}

pub fn print(r: &SparseRow, header: bool) {
    if header {
        println!(
            "\nsparse steps (fused index phase + attention over the selected pages); floor: the step's bytes at the copy bandwidth; approx: top-k tolerance {TOLERANCE}; dep: the attention launched as a dependent of the index phase"
        );
        println!(
            "{:>10} {:>5} {:>7} {:>6} {:>9} {:>9} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9} {:>7} {:>9} {:>8}",
            "flow",
            "batch",
            "context",
            "budget",
            "attention",
            "cache us",
            "host us",
            "index us",
            "approx us",
            "step us",
            "approx us",
            "dep us",
            "MB",
            "floor us",
            "x floor",
            "dense us",
            "speedup"
        );
    }
    println!(
        "{:>10} {:>5} {:>7} {:>6} {:>9} {:>9.1} {:>8.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>8.1} {:>9.1} {:>6.2}x {:>9.1} {:>7.2}x{}",
        r.flow,
        r.batch,
        r.context,
        r.budget_tokens,
        format!(
            "{}w{}b{}",
            r.warps,
            r.min_blocks,
            if r.prefetch { "p" } else { "" }
        ),
        r.cache_phase_us,
        r.host_us,
        r.index_us,
        r.index_approx_us,
        r.step_us,
        r.step_approx_us,
        r.step_dependent_us,
        r.bytes as f64 / 1e6,
        r.floor_us,
        r.over_floor,
        r.dense_us,
        r.speedup,
        if r.default { "  <- default" } else { "" }
    );
}
