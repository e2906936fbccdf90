//! The flow a GPU model decodes with: dense; a built-in flow with hand-written kernels
//! (`block_topk`, `block_topk_fp8`, `quest`, `quest_fp8`, and `h2o` with its per-request state);
//! or any other flow the code generator handles, with its generated kernels. Each keeps its
//! cache phase's page fields for every layer whose decode attention runs the flow (not for
//! sliding-window layers, whose pages are never chosen).

use cudarc::driver::CudaSlice;
use half::bf16;
use vortex_flow::library::is_builtin;
use vortex_flow::state::StateSlot;
use vortex_flow::{Flow, Settings};
use vortex_kv::KvGeometry;

use crate::block_topk::{BlockTopk, Summary};
use crate::generated::GeneratedFlow;
use crate::h2o::HeavyHitters;
use crate::index_row::{RowLaunch, SelRow};
use crate::kv_pool::PoolDtype;
use crate::page_list::PageList;
use crate::topk;
use crate::{CudaError, Device, DeviceTable, GpuLayerKv, KvKernels};

/// A built-in flow whose index phase has a hand-written kernel.
enum HandWritten {
    /// `block_topk`, `block_topk_fp8`, `quest`, `quest_fp8`.
    Summaries(Summary),
    /// `h2o`.
    HeavyHitters,
}

fn hand_written(flow: &Flow) -> Option<HandWritten> {
    if !is_builtin(flow) {
        return None;
    }
    match Summary::for_flow(&flow.name) {
        Some(summary) => Some(HandWritten::Summaries(summary)),
        None => (flow.name == "h2o").then_some(HandWritten::HeavyHitters),
    }
}

/// The index kernel a GPU model runs for `flow`, in words (`vortex flow explain`).
pub fn index_kernel(flow: &Flow) -> String {
    if hand_written(flow).is_some() {
        return format!("the built-in {}'s hand-written kernel", flow.name);
    }
    if flow.settings.budget_ratio.is_some_and(|r| r >= 1.0) {
        return "none, every page is attended (a request that gives a budget keeps the latest)"
            .into();
    }
    let generated = crate::codegen::index_form(flow);
    if flow.index.is_none() {
        return generated;
    }
    if is_builtin(flow) && flow.name == "double_sparse" {
        return format!(
            "on the tensor cores with at most 8 query heads a KV head, pages of 16 tokens and a \
             multiple of 16 channels; else generated, {generated}"
        );
    }
    format!("generated, {generated}")
}

pub enum GpuFlow {
    /// No flow (only while the pool is being replaced): every layer attends densely.
    Dense,
    /// `block_topk`, `block_topk_fp8`, `quest` or `quest_fp8`, with their fused hand-written
    /// index kernel.
    Indexed(Box<IndexedFlow>),
    /// `h2o`: centroids, and each request's accumulated mass in a state slot.
    Heavy(Box<HeavyFlow>),
    Generated(Box<GenFlow>),
}

pub struct HeavyFlow {
    pub settings: Settings,
    pub index: HeavyHitters,
    /// Per layer, the page centroids `[kv_head][page][dim]` (`None`: the layer selects no pages).
    pub centroids: Vec<Option<CudaSlice<bf16>>>,
}

pub struct IndexedFlow {
    pub name: String,
    pub settings: Settings,
    pub index: BlockTopk,
    /// Per layer, the summaries ([`Summary::fields`] of them, as bytes), each
    /// `[kv_head][page][dim]` (`None`: the layer selects no pages).
    pub fields: Vec<Option<Vec<CudaSlice<u8>>>>,
}

pub struct GenFlow {
    pub name: String,
    pub settings: Settings,
    /// Whether the top-k is approximate (a request's recall tolerance then applies).
    pub approx: bool,
    pub kernels: GeneratedFlow,
    /// Per layer, the flow's page fields (`None`: the layer selects no pages).
    pub fields: Vec<Option<Vec<CudaSlice<u8>>>>,
}

impl GpuFlow {
    /// `flow` on a pool of `num_pages` pages storing `dtype`, for a model whose layer `l` runs
    /// the flow where `selecting[l]` (only those keep summaries), for sequences of at most
    /// `seq_pages` pages. A flow the code generator cannot handle yet is
    /// [`CudaError::Unsupported`].
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        dev: &Device,
        flow: &Flow,
        geom: KvGeometry,
        dtype: PoolDtype,
        selecting: &[bool],
        num_pages: usize,
        seq_pages: usize,
    ) -> Result<Self, CudaError> {
        let g = flow.geometry;
        if (g.heads_kv, g.head_dim, g.page_size) != (geom.kv_heads, geom.head_dim, geom.page_size) {
            return Err(CudaError::Invalid(format!(
                "flow '{}' was checked for another geometry than the model's",
                flow.name
            )));
        }
        // A flow that selects must fit the longest sequence's candidates in one top-k. The dense
        // flow selects only for a request that gives it a budget; past the limit, that step
        // fails with an error instead.
        let longest = seq_pages.min(num_pages);
        if longest > topk::MAX_N && !(flow.name == "dense" && is_builtin(flow)) {
            return Err(CudaError::Unsupported(format!(
                "flow '{}' on the GPU ranks at most {} candidate pages a sequence, and sequences \
                 here reach {longest} pages: use a larger page size",
                flow.name,
                topk::MAX_N
            )));
        }
        // The dense flow too runs through generated kernels: a request may give it a budget,
        // and then pages rank by recency as on the CPU. Layers where every row is dense attend
        // through the dense table without an index phase.
        let hand = hand_written(flow);
        if let Some(HandWritten::Summaries(summary)) = hand {
            // Each step's launches take their requests' recall tolerance (`tolerance_for`).
            let index = BlockTopk::new(dev, geom, g.heads_q, summary)?;
            let fields = per_layer(selecting, || {
                (0..summary.fields())
                    .map(|_| index.alloc_field(dev, num_pages))
                    .collect()
            })?;
            return Ok(Self::Indexed(Box::new(IndexedFlow {
                name: flow.name.clone(),
                settings: flow.settings.clone(),
                index,
                fields,
            })));
        }
        if let Some(HandWritten::HeavyHitters) = hand {
            let index =
                HeavyHitters::new(dev, geom, g.heads_q, selecting, seq_pages.min(num_pages))?;
            let centroids = per_layer(selecting, || index.alloc_centroids(dev, num_pages))?;
            return Ok(Self::Heavy(Box::new(HeavyFlow {
                settings: flow.settings.clone(),
                index,
                centroids,
            })));
        }
        Self::generated(dev, flow, dtype, selecting, num_pages, seq_pages)
    }

    /// `flow` with generated kernels, whatever its name.
    pub fn generated(
        dev: &Device,
        flow: &Flow,
        dtype: PoolDtype,
        selecting: &[bool],
        num_pages: usize,
        seq_pages: usize,
    ) -> Result<Self, CudaError> {
        let kernels = GeneratedFlow::new(dev, flow, dtype)?.for_sequences(
            dev,
            selecting,
            seq_pages.min(num_pages),
        )?;
        let fields = per_layer(selecting, || kernels.alloc_fields(dev, num_pages))?;
        Ok(Self::Generated(Box::new(GenFlow {
            name: flow.name.clone(),
            settings: flow.settings.clone(),
            approx: flow.index.as_ref().is_some_and(|i| i.approx),
            kernels,
            fields,
        })))
    }

    pub fn name(&self) -> &str {
        match self {
            Self::Dense => "dense",
            Self::Indexed(f) => &f.name,
            Self::Heavy(_) => "h2o",
            Self::Generated(f) => &f.name,
        }
    }

    /// The settings of a sparse flow.
    pub fn settings(&self) -> Option<&Settings> {
        match self {
            Self::Dense => None,
            Self::Indexed(f) => Some(&f.settings),
            Self::Heavy(f) => Some(&f.settings),
            Self::Generated(f) => Some(&f.settings),
        }
    }

    /// The recall tolerance of a request's rows, as on the CPU: its own where the flow's top-k
    /// is approximate, else 0 (exact; the built-in flows with hand-written kernels all rank
    /// exactly).
    pub fn tolerance_for(&self, settings: &Settings) -> f32 {
        let approx = matches!(self, Self::Generated(f) if f.approx);
        if approx && settings.tolerance > 0.0 {
            settings.tolerance_f32()
        } else {
            0.0
        }
    }

    /// The cache phase: summarises `pages` (just completed) of `layer`; nothing where the layer
    /// keeps no summaries.
    pub fn summarize(
        &mut self,
        dev: &Device,
        kernels: &KvKernels,
        layer: usize,
        kv: &GpuLayerKv,
        pages: &PageList,
    ) -> Result<(), CudaError> {
        match self {
            Self::Dense => Ok(()),
            Self::Indexed(f) => match kept_mut(&mut f.fields, layer)? {
                Some(fields) => f.index.summarize(dev, kernels, kv, pages, fields),
                None => Ok(()),
            },
            Self::Heavy(f) => match kept_mut(&mut f.centroids, layer)? {
                Some(c) => kernels.page_means(dev, kv, pages, c),
                None => Ok(()),
            },
            Self::Generated(f) => match kept_mut(&mut f.fields, layer)? {
                Some(fields) => f.kernels.summarize(dev, kv, fields, pages),
                None => Ok(()),
            },
        }
    }

    /// Device bytes of the summaries the flow keeps for every page of the pool, over the layers
    /// that keep them.
    pub fn summary_bytes(&self) -> usize {
        let sum = |fields: &[Option<Vec<CudaSlice<u8>>>]| {
            fields.iter().flatten().flatten().map(|f| f.len()).sum()
        };
        match self {
            Self::Dense => 0,
            Self::Indexed(f) => sum(&f.fields),
            Self::Heavy(f) => f.centroids.iter().flatten().map(|c| 2 * c.len()).sum(),
            Self::Generated(f) => sum(&f.fields),
        }
    }

    /// Per layer, whether it keeps page summaries (empty for the dense flow, which keeps none).
    pub fn summarized_layers(&self) -> Vec<bool> {
        let kept = |v: &[Option<Vec<CudaSlice<u8>>>]| v.iter().map(Option::is_some).collect();
        match self {
            Self::Dense => Vec::new(),
            Self::Indexed(f) => kept(&f.fields),
            Self::Heavy(f) => f.centroids.iter().map(Option::is_some).collect(),
            Self::Generated(f) => kept(&f.fields),
        }
    }

    /// Whether the flow keeps per-request state: each decoding sequence then needs a
    /// [`state_slot`](Self::state_slot).
    pub fn keeps_state(&self) -> bool {
        match self {
            Self::Heavy(_) => true,
            Self::Generated(f) => f.kernels.keeps_state(),
            _ => false,
        }
    }

    /// A fresh state slot for a new request (`None` for a flow without state).
    pub fn state_slot(&mut self, dev: &Device) -> Result<Option<StateSlot>, CudaError> {
        match self {
            Self::Heavy(f) => f.index.take_slot(dev).map(Some),
            Self::Generated(f) if f.kernels.keeps_state() => f.kernels.take_slot(dev).map(Some),
            _ => Ok(None),
        }
    }

    /// Whether `slot` belongs to this flow's state.
    pub fn owns_slot(&self, slot: &StateSlot) -> bool {
        match self {
            Self::Heavy(f) => f.index.owns(slot),
            Self::Generated(f) => f.kernels.owns(slot),
            _ => false,
        }
    }

    /// Copies the rows of a step this flow selects for, those of every selection one after
    /// another (and, for a flow with state, each sequence's slot; `None` for sequences of other
    /// flows) to the device, for launches of at most `widest` of them, each into its
    /// selection's sparse table ([`selection_table`](crate::index_row::selection_table)).
    pub fn load_rows(
        &mut self,
        dev: &Device,
        dense: &DeviceTable,
        rows: &[SelRow],
        slots: &[Option<&StateSlot>],
        widest: usize,
    ) -> Result<(), CudaError> {
        match self {
            Self::Dense => Err(CudaError::Invalid("the dense flow selects no pages".into())),
            Self::Indexed(f) => f.index.load_rows(dev, rows),
            Self::Heavy(f) => f.index.load_rows(dev, dense, rows, slots),
            Self::Generated(f) => f.kernels.load_rows(dev, dense, rows, slots, widest),
        }
    }

    /// The device addresses the index phase's launch bakes in (a captured graph reads them).
    pub fn addresses(&self, dev: &Device) -> Vec<u64> {
        match self {
            Self::Dense => Vec::new(),
            Self::Indexed(f) => f.index.addresses(dev),
            Self::Heavy(f) => f.index.addresses(dev),
            Self::Generated(f) => f.kernels.addresses(dev),
        }
    }

    /// What the index phase's launch bakes in from `rows`, beyond their buffer and number (a
    /// captured graph replays it for other rows with the same shape).
    pub fn launch_shape(&self, rows: &[SelRow]) -> Vec<u64> {
        match self {
            Self::Dense => Vec::new(),
            // The index kernels read each row from the device: only their shared memory, sized
            // for the longest row in buckets, and the blocks a row are baked in.
            Self::Indexed(f) => vec![
                f.index.shared_bytes(rows).map_or(0, u64::from),
                u64::from(f.index.parts(rows)),
            ],
            Self::Heavy(f) => vec![
                f.index.shared_bytes(rows).map_or(0, u64::from),
                u64::from(f.index.parts(rows)),
            ],
            Self::Generated(f) => f.kernels.launch_shape(rows),
        }
    }

    /// The index phase of `layer`: writes the pages the launch's rows keep into `sparse`.
    #[allow(clippy::too_many_arguments)]
    pub fn select(
        &self,
        dev: &Device,
        layer: usize,
        dense: &DeviceTable,
        num_pages: usize,
        q: &CudaSlice<f32>,
        rows: RowLaunch,
        sparse: &mut DeviceTable,
    ) -> Result<(), CudaError> {
        match self {
            Self::Dense => Err(CudaError::Invalid("the dense flow selects no pages".into())),
            Self::Indexed(f) => {
                let fields: Vec<_> = kept(&f.fields, layer)?.iter().collect();
                f.index
                    .launch_at(dev, dense, &fields, num_pages, q, rows, sparse)
            }
            Self::Heavy(f) => {
                let centroids = kept(&f.centroids, layer)?;
                f.index
                    .launch_at(dev, layer, dense, centroids, num_pages, q, rows, sparse)
            }
            Self::Generated(f) => {
                let fields = kept(&f.fields, layer)?;
                f.kernels
                    .launch_at(dev, layer, dense, fields, num_pages, q, rows, sparse)
            }
        }
    }
}

/// One `alloc` per layer where `selecting`, `None` elsewhere.
fn per_layer<T>(
    selecting: &[bool],
    mut alloc: impl FnMut() -> Result<T, CudaError>,
) -> Result<Vec<Option<T>>, CudaError> {
    selecting
        .iter()
        .map(|&s| if s { alloc().map(Some) } else { Ok(None) })
        .collect()
}

/// The summaries `layer` keeps, an error where it keeps none (a sliding-window layer, or one
/// past the model's).
fn kept<T>(per_layer: &[Option<T>], layer: usize) -> Result<&T, CudaError> {
    per_layer
        .get(layer)
        .and_then(Option::as_ref)
        .ok_or_else(|| {
            CudaError::Invalid(format!(
                "layer {layer} keeps no page summaries to select from"
            ))
        })
}

/// The summaries `layer` keeps (`None`: a sliding-window layer), an error past the model's.
fn kept_mut<T>(per_layer: &mut [Option<T>], layer: usize) -> Result<Option<&mut T>, CudaError> {
    let layers = per_layer.len();
    per_layer
        .get_mut(layer)
        .map(Option::as_mut)
        .ok_or_else(|| CudaError::Invalid(format!("layer {layer} of a model of {layers}")))
}
