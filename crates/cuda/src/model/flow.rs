//! The flow a GPU model decodes with: dense, or a built-in flow with GPU kernels (its cache
//! phase's per-page summaries for every layer, and its fused index phase).

use cudarc::driver::CudaSlice;
use half::bf16;
use vortex_flow::Settings;
use vortex_kv::KvGeometry;

use crate::block_topk::{BlockTopk, Summary};
use crate::{CudaError, Device, GpuLayerKv, KvKernels};

/// Flows that have GPU kernels.
pub const GPU_FLOWS: &[&str] = &["dense", "block_topk", "quest"];

pub enum GpuFlow {
    Dense,
    Indexed(Box<IndexedFlow>),
}

pub struct IndexedFlow {
    pub name: String,
    pub settings: Settings,
    pub index: BlockTopk,
    /// Per layer, the summaries ([`Summary::fields`] of them), each `[kv_head][page][dim]`.
    pub fields: Vec<Vec<CudaSlice<bf16>>>,
}

impl GpuFlow {
    /// The flow `name` with `settings`, with summaries for `layers` layers of a pool of
    /// `num_pages` pages; a flow without GPU kernels is [`CudaError::Unsupported`].
    pub fn new(
        dev: &Device,
        name: &str,
        settings: Settings,
        geom: KvGeometry,
        heads_q: usize,
        layers: usize,
        num_pages: usize,
    ) -> Result<Self, CudaError> {
        if name == "dense" {
            return Ok(Self::Dense);
        }
        let Some(summary) = Summary::for_flow(name) else {
            return Err(CudaError::Unsupported(format!(
                "flow '{name}' has no GPU kernels yet (GPU flows: {})",
                GPU_FLOWS.join(", ")
            )));
        };
        let mut index = BlockTopk::new(dev, geom, heads_q, summary)?;
        index.tolerance = settings.tolerance as f32;
        let fields = (0..layers)
            .map(|_| {
                (0..summary.fields())
                    .map(|_| index.alloc_field(dev, num_pages))
                    .collect::<Result<Vec<_>, _>>()
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::Indexed(Box::new(IndexedFlow {
            name: name.to_string(),
            settings,
            index,
            fields,
        })))
    }

    pub fn name(&self) -> &str {
        match self {
            Self::Dense => "dense",
            Self::Indexed(f) => &f.name,
        }
    }

    /// The cache phase: summarises `pages` (just completed) of `layer`.
    pub fn summarize(
        &mut self,
        dev: &Device,
        kernels: &KvKernels,
        layer: usize,
        kv: &GpuLayerKv,
        pages: &[u32],
    ) -> Result<(), CudaError> {
        let Self::Indexed(f) = self else {
            return Ok(());
        };
        let fields = &mut f.fields[layer];
        match f.index.summary {
            Summary::Centroid => kernels.page_means(dev, kv, pages, &mut fields[0]),
            Summary::MinMax => {
                let (kmax, kmin) = fields.split_at_mut(1);
                kernels.page_minmax(dev, kv, pages, &mut kmax[0], &mut kmin[0])
            }
        }
    }
}
