//! The sparse steps on the GPU in `vortex bench attention --device cuda` (`block_topk`,
//! `block_topk_fp8`, `quest`, `quest_fp8`, `h2o` with their hand-written kernels, any other flow or flow
//! file with its generated ones):
//! the fused index phase (page scores from the summaries, top-k, sparse page table; for a flow
//! with state also each request's state) and paged attention over the selected pages, against
//! its bytes floor and the dense step of the batch.

use std::time::Instant;

use half::bf16;
use serde::Serialize;
use vortex_cuda::PoolDtype;
use vortex_cuda::block_topk::{BlockTopk, Summary};
use vortex_cuda::generated::GeneratedFlow;
use vortex_cuda::h2o::HeavyHitters;
use vortex_cuda::index_row::{SelRow, sel_rows};
use vortex_cuda::page_list::PageList;
use vortex_cuda::step_attention::StepAttention;
use vortex_cuda::timing::{median, time_grouped, time_runs};
use vortex_cuda::{CudaSlice, DecodeAttention, Device, DeviceTable, GpuLayerKv, KvKernels};
use vortex_flow::library::{is_builtin, load};
use vortex_flow::state::StateSlot;
use vortex_flow::{Flow, Geometry};
use vortex_kv::KvGeometry;

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
    /// Blocks that scored each row of the index phase.
    pub index_parts: u32,
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
    /// Steps timed back to back between two events.
    pub per_mark: usize,
    /// Chooses the build a model step would use.
    pub step_attn: &'a StepAttention,
    /// Blocks that score a row of a hand-written index phase (None: as planned).
    pub index_parts: Option<u32>,
}

/// The index phase a sparse step times, with its summaries (and for a flow with state each
/// sequence's state slot): hand-written for `block_topk`, `block_topk_fp8`, `quest`, `quest_fp8`
/// and `h2o`, else generated.
enum Index {
    Summaries(BlockTopk, Vec<CudaSlice<u8>>),
    Heavy(HeavyHitters, CudaSlice<bf16>, Vec<StateSlot>),
    Generated(Box<GeneratedFlow>, Vec<CudaSlice<u8>>, Vec<StateSlot>),
}

impl Index {
    fn new(
        dev: &Device,
        kv: KvGeometry,
        flow: &Flow,
        num_pages: usize,
        lens: &[usize],
    ) -> Result<Self, vortex_cuda::CudaError> {
        let heads_q = flow.geometry.heads_q;
        let longest = lens.iter().map(|&n| kv.pages_for(n)).max().unwrap_or(1);
        let hand_written = is_builtin(flow).then_some(flow.name.as_str());
        if hand_written == Some("h2o") {
            let mut index = HeavyHitters::new(dev, kv, heads_q, &[true], longest)?;
            let slots = lens
                .iter()
                .map(|_| index.take_slot(dev))
                .collect::<Result<_, _>>()?;
            let centroids = index.alloc_centroids(dev, num_pages)?;
            return Ok(Self::Heavy(index, centroids, slots));
        }
        let Some(summary) = hand_written.and_then(Summary::for_flow) else {
            let mut gen_flow = GeneratedFlow::new(dev, flow, PoolDtype::Bf16)?.for_sequences(
                dev,
                &[true],
                longest,
            )?;
            let fields = gen_flow.alloc_fields(dev, num_pages)?;
            let slots = if gen_flow.keeps_state() {
                lens.iter()
                    .map(|_| gen_flow.take_slot(dev))
                    .collect::<Result<_, _>>()?
            } else {
                Vec::new()
            };
            return Ok(Self::Generated(Box::new(gen_flow), fields, slots));
        };
        let topk = BlockTopk::new(dev, kv, heads_q, summary)?;
        let fields = (0..summary.fields())
            .map(|_| topk.alloc_field(dev, num_pages))
            .collect::<Result<_, _>>()?;
        Ok(Self::Summaries(topk, fields))
    }

    /// The cache phase over `complete` pages.
    fn summarize(
        &mut self,
        dev: &Device,
        kernels: &KvKernels,
        layer: &GpuLayerKv,
        complete: &PageList,
    ) -> Result<(), vortex_cuda::CudaError> {
        match self {
            Self::Summaries(t, f) => t.summarize(dev, kernels, layer, complete, f),
            Self::Heavy(_, c, _) => kernels.page_means(dev, layer, complete, c),
            Self::Generated(g, f, _) => g.summarize(dev, layer, f, complete),
        }
    }

    fn prepare(
        &mut self,
        dev: &Device,
        dense: &DeviceTable,
        rows: &[SelRow],
    ) -> Result<DeviceTable, vortex_cuda::CudaError> {
        match self {
            Self::Summaries(t, _) => t.prepare(dev, dense, rows, None),
            Self::Heavy(h, _, slots) => {
                let refs: Vec<Option<&StateSlot>> = slots.iter().map(Some).collect();
                h.prepare(dev, dense, rows, &refs, None)
            }
            Self::Generated(g, _, slots) => {
                let refs: Vec<Option<&StateSlot>> =
                    (0..dense.batch).map(|b| slots.get(b)).collect();
                g.prepare(dev, dense, rows, &refs, None)
            }
        }
    }

    fn set_tolerance(&mut self, tolerance: f32) {
        match self {
            Self::Summaries(t, _) => t.tolerance = tolerance,
            Self::Heavy(h, _, _) => h.tolerance = tolerance,
            Self::Generated(g, _, _) => g.tolerance = tolerance,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        dev: &Device,
        dense: &DeviceTable,
        num_pages: usize,
        q: &CudaSlice<f32>,
        rows: &[SelRow],
        sparse: &mut DeviceTable,
    ) -> Result<(), vortex_cuda::CudaError> {
        match self {
            Self::Summaries(t, f) => {
                let refs: Vec<&_> = f.iter().collect();
                t.launch(dev, dense, &refs, num_pages, q, rows, sparse)
            }
            Self::Heavy(h, c, _) => h.launch(dev, 0, dense, c, num_pages, q, rows, sparse),
            Self::Generated(g, f, _) => g.launch(dev, 0, dense, f, num_pages, q, rows, sparse),
        }
    }

    /// Bytes the index phase reads (and writes) for a row of `pages` pages, `complete` of them
    /// complete, `candidates` of them scored: summaries, page ids, and the state. A flow that
    /// combines pages or keeps state reads every complete page's fields, once at the least.
    fn bytes(&self, flow: &Flow, complete: usize, candidates: usize) -> usize {
        let head_dim = flow.geometry.head_dim;
        match self {
            Self::Summaries(t, _) => {
                let summary = t.summary.fields() * head_dim * t.summary.dtype().size();
                candidates * (summary + 4)
            }
            Self::Heavy(..) => complete * (head_dim * 2 + 4 + 8),
            Self::Generated(..) => {
                let fields: usize = flow.fields.iter().map(|f| f.elems() * f.dtype.size()).sum();
                let state: usize = flow.states.iter().map(|s| s.rows * s.cols * 4 * 2).sum();
                if vortex_cuda::codegen::runs_in_passes(flow) {
                    complete * (fields + 4 + state)
                } else {
                    candidates * (fields + 4)
                }
            }
        }
    }
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
    let flow = load(flow_name, g).map_err(|e| e.to_string())?;
    let settings = crate::bench_attention::sparse_settings(&flow, budget_tokens)?;
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
    let complete = PageList::new(dev, &complete).map_err(e)?;
    let mut index = Index::new(dev, kv, &flow, layer.num_pages, s.lens).map_err(e)?;
    match &mut index {
        Index::Summaries(t, _) => t.split.fixed = s.index_parts,
        Index::Heavy(h, _, _) => h.split.fixed = s.index_parts,
        Index::Generated(g, _, _) => g.split.fixed = s.index_parts,
    }
    let ms = time_runs(dev, 1, 1, || {
        index.summarize(dev, s.kv_kernels, layer, &complete)
    })
    .map_err(e)?;
    let cache_phase_us = ms[0] * 1e3;
    let t0 = Instant::now();
    let per_seq: Vec<&vortex_flow::Settings> = s.lens.iter().map(|_| &settings).collect();
    let rows = sel_rows(&s.dense.row_pages, &per_seq, 0, s.lens, kv.kv_heads);
    let mut sparse = index.prepare(dev, s.dense, &rows).map_err(e)?;
    let index_parts = match &index {
        Index::Summaries(t, _) => t.parts(&rows),
        Index::Heavy(h, _, _) => h.parts(&rows),
        Index::Generated(g, _, _) => g.parts(&rows),
    };
    attn.config.waves = 0;
    let default = s.step_attn.choose(&sparse).0 == attn.variant;
    let plan = attn.plan(&sparse);
    let host_us = t0.elapsed().as_secs_f64() * 1e6;
    attn.load_plan(dev, &plan).map_err(e)?;
    let scale = 1.0 / (g.head_dim as f32).sqrt();
    // Median microseconds of the index phase alone, or with the attention after it.
    let mut time = |index: &mut Index, attn: &mut DecodeAttention, with_attention: bool| {
        let ms = time_grouped(dev, 3, s.iters, s.per_mark, || {
            index.launch(dev, s.dense, layer.num_pages, s.q, &rows, &mut sparse)?;
            if with_attention {
                attn.launch(dev, layer, &sparse, s.q, scale, &mut *s.out)?;
            }
            Ok(())
        })
        .map_err(e)?;
        Ok::<f64, String>(median(&ms) * 1e3)
    };
    let mut times = [0.0f64; 4];
    for (j, tolerance) in [0.0, TOLERANCE].into_iter().enumerate() {
        index.set_tolerance(tolerance);
        times[2 * j] = time(&mut index, attn, false)?;
        times[2 * j + 1] = time(&mut index, attn, true)?;
    }
    index.set_tolerance(0.0);
    attn.dependent_launch = true;
    let dependent = time(&mut index, attn, true);
    attn.dependent_launch = false;
    let step_dependent_us = dependent?;
    // Bytes a step must move: K and V of the selected pages, what the index phase reads of
    // the candidates (summaries, page ids, h2o's mass of every complete page), the selected
    // indices (the fused index phase keeps the scores on chip).
    let page_kv = 2 * g.page_size * g.head_dim * layer.dtype.size();
    let bytes: usize = rows
        .iter()
        .map(|r| {
            let kept = (r.sinks + r.k + r.recent) as usize;
            let cand = if r.k > 0 {
                (r.pages - r.sinks - r.recent) as usize
            } else {
                0
            };
            let complete = if r.dense == 0 {
                s.lens[r.seq as usize] / g.page_size
            } else {
                0
            };
            kept * (page_kv + 4) + index.bytes(&flow, complete, cand)
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
        index_parts,
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
            "\nsparse steps (fused index phase + attention over the selected pages); floor: the step's bytes at the copy bandwidth; approx: top-k tolerance {TOLERANCE}; dep: the attention launched as a dependent of the index phase; parts: blocks that score an index row together; the block_topk and Quest index phases launch as dependents of the kernel before them"
        );
        println!(
            "{:>10} {:>5} {:>7} {:>6} {:>9} {:>5} {:>9} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9} {:>7} {:>9} {:>8}",
            "flow",
            "batch",
            "context",
            "budget",
            "attention",
            "parts",
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
        "{:>10} {:>5} {:>7} {:>6} {:>9} {:>5} {:>9.1} {:>8.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>8.1} {:>9.1} {:>6.2}x {:>9.1} {:>7.2}x{}",
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
        r.index_parts,
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
