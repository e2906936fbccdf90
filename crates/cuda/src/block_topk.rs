//! The block top-k index phase on the GPU: centroid scores and an exact top-k per (sequence,
//! KV head) that writes the sparse page table, sinks and recent pages reserved, as the CPU
//! runner's `select` does for the built-in `block_topk` flow.

use cudarc::driver::{
    CudaFunction, CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use half::bf16;
use vortex_flow::Settings;
use vortex_kv::KvGeometry;

use crate::compile::{ModuleSpec, build};
use crate::error::driver;
use crate::{CudaError, Device, DeviceTable};

const SOURCE: &str = include_str!("kernels/block_topk.cu");
const SCORE_WARPS: usize = 4;
const PAGES_PER_WARP: usize = 32;
const SEL_THREADS: u32 = 1024;

/// One (sequence, KV head) row of the selection, as the kernels' `SelRow`.
#[repr(C, align(16))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SelRow {
    pub seq: i32,
    pub head: i32,
    /// The sequence's pages; candidates are `sinks..pages - recent`, `k` of them kept.
    pub pages: i32,
    pub sinks: i32,
    pub recent: i32,
    pub k: i32,
    /// First slot of the row in the sparse table's indices.
    pub out: i32,
    /// First candidate's slot in the score buffer.
    pub score_off: i32,
}

// SAFETY: plain `repr(C)` integers, the layout the kernels declare.
unsafe impl DeviceRepr for SelRow {}
// SAFETY: all-zero integers are a valid value.
unsafe impl ValidAsZeroBits for SelRow {}

/// The rows of one step from each sequence's settings, exactly as the CPU selection sizes them:
/// a sequence that is dense this step (short, a dense layer, or a budget covering it) keeps all
/// its pages. Returns the rows and the number of score slots they need.
pub fn sel_rows(
    row_pages: &[u32],
    settings: &[&Settings],
    layer: usize,
    tokens: &[usize],
    kv_heads: usize,
) -> (Vec<SelRow>, usize) {
    let (mut rows, mut out, mut scores) = (Vec::new(), 0usize, 0usize);
    for (seq, (&pages, s)) in row_pages.iter().zip(settings).enumerate() {
        let pages = pages as usize;
        let (sinks, recent, k) = if s.is_dense(layer, tokens[seq], pages) {
            (pages, 0, 0)
        } else {
            let sinks = s.sinks.min(pages);
            let recent = s.recent.max(1).min(pages - sinks);
            let middle = pages - recent - sinks;
            let k = s
                .budget_pages(pages)
                .saturating_sub(sinks + recent)
                .min(middle);
            (sinks, recent, k)
        };
        for head in 0..kv_heads {
            rows.push(SelRow {
                seq: seq as i32,
                head: head as i32,
                pages: pages as i32,
                sinks: sinks as i32,
                recent: recent as i32,
                k: k as i32,
                out: out as i32,
                score_off: scores as i32,
            });
            out += sinks + k + recent;
            if k > 0 {
                scores += pages - sinks - recent;
            }
        }
    }
    (rows, scores)
}

/// The block top-k index-phase kernels for one geometry.
pub struct BlockTopk {
    scores_fn: CudaFunction,
    select_fn: CudaFunction,
    pub geom: KvGeometry,
    pub heads_q: usize,
    rows: CudaSlice<SelRow>,
    scores: CudaSlice<f32>,
}

impl BlockTopk {
    pub fn new(dev: &Device, geom: KvGeometry, heads_q: usize) -> Result<Self, CudaError> {
        let d = geom.head_dim;
        if !(d.is_multiple_of(8) && d >= 8 && 32 % (d / 8) == 0) {
            return Err(CudaError::Unsupported(format!(
                "head_dim {d} for block top-k"
            )));
        }
        if heads_q == 0 || !heads_q.is_multiple_of(geom.kv_heads) {
            return Err(CudaError::Invalid(format!(
                "{heads_q} query heads over {} KV heads",
                geom.kv_heads
            )));
        }
        let built = build(
            dev,
            &ModuleSpec {
                name: "block_topk.cu",
                source: SOURCE,
                defines: vec![
                    ("HEAD_DIM", d.to_string()),
                    ("GROUP", (heads_q / geom.kv_heads).to_string()),
                ],
            },
        )?;
        let f = |n: &str| {
            built
                .module
                .load_function(n)
                .map_err(driver("cuModuleGetFunction"))
        };
        let s = &dev.stream;
        Ok(Self {
            scores_fn: f("centroid_scores")?,
            select_fn: f("select_pages")?,
            geom,
            heads_q,
            rows: s.alloc_zeros(1).map_err(driver("cuMemAlloc"))?,
            scores: s.alloc_zeros(1).map_err(driver("cuMemAlloc"))?,
        })
    }

    /// A zeroed `centroid` field for a pool of `num_pages` pages.
    pub fn alloc_centroids(
        &self,
        dev: &Device,
        num_pages: usize,
    ) -> Result<CudaSlice<bf16>, CudaError> {
        let n = self.geom.kv_heads * num_pages * self.geom.head_dim;
        dev.stream.alloc_zeros(n).map_err(driver("cuMemAlloc"))
    }

    /// Copies a step's rows to the device and makes the sparse table they write: one row per
    /// (sequence, KV head), its last page that of the sequence.
    pub fn prepare(
        &mut self,
        dev: &Device,
        dense: &DeviceTable,
        rows: &[SelRow],
        score_slots: usize,
    ) -> Result<DeviceTable, CudaError> {
        let s = &dev.stream;
        if self.rows.len() < rows.len() {
            self.rows = s.alloc_zeros(rows.len()).map_err(driver("cuMemAlloc"))?;
        }
        if self.scores.len() < score_slots {
            self.scores = s.alloc_zeros(score_slots).map_err(driver("cuMemAlloc"))?;
        }
        if !rows.is_empty() {
            s.memcpy_htod(rows, &mut self.rows.slice_mut(..rows.len()))
                .map_err(driver("cuMemcpyHtoD"))?;
        }
        let heads = self.geom.kv_heads;
        let lens: Vec<u32> = rows
            .iter()
            .map(|r| (r.sinks + r.k + r.recent) as u32)
            .collect();
        let last: Vec<u32> = rows
            .iter()
            .map(|r| dense.last_len[r.seq as usize])
            .collect();
        DeviceTable::for_selection(dev, &lens, &last, heads, dense)
    }

    /// Scores the candidates and writes the selected pages into `sparse` (made by
    /// [`prepare`](Self::prepare) for these `rows`). `centroids` is the flow's bf16 `centroid`
    /// field, `[kv_head][pool page][head_dim]`, for a pool of `num_pages` pages.
    #[allow(clippy::too_many_arguments)]
    pub fn launch(
        &self,
        dev: &Device,
        dense: &DeviceTable,
        centroids: &CudaSlice<bf16>,
        num_pages: usize,
        q: &CudaSlice<f32>,
        rows: &[SelRow],
        sparse: &mut DeviceTable,
    ) -> Result<(), CudaError> {
        let g = self.geom;
        if centroids.len() < g.kv_heads * num_pages * g.head_dim || dense.num_pages > num_pages {
            return Err(CudaError::Invalid(
                "centroid field smaller than the pool".into(),
            ));
        }
        if q.len() != dense.batch * self.heads_q * g.head_dim || dense.rows_per_seq != 1 {
            return Err(CudaError::Invalid(
                "block top-k needs the dense table and one query per sequence".into(),
            ));
        }
        if rows.is_empty() {
            return Ok(());
        }
        let most = rows
            .iter()
            .map(|r| (r.pages - r.sinks - r.recent).max(0) as usize)
            .max()
            .unwrap_or(0);
        let per_block = SCORE_WARPS * PAGES_PER_WARP;
        let (num_pages_i, heads) = (num_pages as i32, g.kv_heads as i32);
        let stream = &dev.stream;
        if most > 0 {
            let mut l = stream.launch_builder(&self.scores_fn);
            l.arg(centroids)
                .arg(&num_pages_i)
                .arg(&dense.indptr)
                .arg(&dense.indices)
                .arg(q)
                .arg(&self.rows)
                .arg(&heads)
                .arg(&self.scores);
            let cfg = LaunchConfig {
                grid_dim: (most.div_ceil(per_block) as u32, rows.len() as u32, 1),
                block_dim: ((SCORE_WARPS * 32) as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: argument types match the kernel; rows were made from this dense table.
            unsafe { l.launch(cfg) }.map_err(driver("cuLaunchKernel(centroid_scores)"))?;
        }
        self.launch_select(dev, dense, rows, sparse)
    }

    /// The second half of [`launch`](Self::launch): top-k over the scores it left, and the
    /// sparse table.
    pub fn launch_select(
        &self,
        dev: &Device,
        dense: &DeviceTable,
        rows: &[SelRow],
        sparse: &mut DeviceTable,
    ) -> Result<(), CudaError> {
        if rows.is_empty() {
            return Ok(());
        }
        let slots = rows
            .iter()
            .map(|r| (r.out + r.sinks + r.k + r.recent) as usize)
            .max();
        if rows.len() > self.rows.len() || slots > Some(sparse.indices.len()) {
            return Err(CudaError::Invalid(
                "rows and sparse table do not come from the same prepare".into(),
            ));
        }
        let mut l = dev.stream.launch_builder(&self.select_fn);
        l.arg(&self.scores)
            .arg(&dense.indptr)
            .arg(&dense.indices)
            .arg(&self.rows)
            .arg(&mut sparse.indices);
        let cfg = LaunchConfig {
            grid_dim: (rows.len() as u32, 1, 1),
            block_dim: (SEL_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument types match the kernel; the sparse table has the slots the rows name.
        unsafe { l.launch(cfg) }.map_err(driver("cuLaunchKernel(select_pages)"))?;
        Ok(())
    }
}
