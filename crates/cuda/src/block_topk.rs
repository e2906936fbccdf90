//! The index phase of the built-in `block_topk`, `block_topk_fp8`, `quest` and `quest_fp8`
//! flows on the GPU, fused into one kernel per step: for each (sequence, KV head), page scores
//! from the flow's summaries, a top-k over them in shared memory (exact, or approximate with a
//! recall tolerance), and the sparse page table row, sinks and recent pages reserved, as the CPU
//! runner's `select` does. A step of few rows scores each row in a cluster of blocks
//! ([`row_parts`](crate::index_row::row_parts)).

use cudarc::driver::{CudaFunction, CudaSlice, DeviceRepr, LaunchConfig};
use half::bf16;
use std::sync::LazyLock;
use vortex_kv::{KvDtype, KvGeometry};

use crate::compile::{ModuleSpec, build};
use crate::index_row::{
    INDEX_ROW, RowLaunch, RowSplit, SelRow, bucketed, check_step, longest_candidates,
    ready_at_block, rows_at, selection_table, upload_rows,
};
use crate::kv_pool::KV_ELEM;
use crate::launch::{self, CLUSTER, RawArgs};
use crate::page_list::PageList;
use crate::{CudaError, Device, DeviceTable, GpuLayerKv, KvKernels, MMA, topk};

const OWN: &str = include_str!("kernels/block_topk.cu");
/// Centroid scores on the tensor cores, shared with the h2o index kernel.
pub(crate) const SCORES: &str = include_str!("kernels/scores.cu");
/// The fp8 conversions, top-k, centroid-scoring and row device code, then the index kernel.
static SOURCE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{KV_ELEM}\n{}\n{MMA}\n{SCORES}\n{INDEX_ROW}\n{CLUSTER}\n{OWN}",
        topk::SOURCE
    )
});

/// Which per-page summaries score a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Summary {
    /// `block_topk`: one bf16 `centroid` field, score `q . centroid`.
    Centroid,
    /// `block_topk_fp8`: the same with the centroid in fp8 e4m3.
    CentroidFp8,
    /// `quest`: `kmax` and `kmin` fields, score `sum_d max(q kmax, q kmin)`.
    MinMax,
    /// `quest_fp8`: the same with the envelopes in fp8 e4m3.
    MinMaxFp8,
}

impl Summary {
    pub fn for_flow(name: &str) -> Option<Self> {
        match name {
            "block_topk" => Some(Self::Centroid),
            "block_topk_fp8" => Some(Self::CentroidFp8),
            "quest" => Some(Self::MinMax),
            "quest_fp8" => Some(Self::MinMaxFp8),
            _ => None,
        }
    }

    /// The fields the kernel reads, in the flow's declaration order.
    pub fn fields(self) -> usize {
        match self {
            Self::Centroid | Self::CentroidFp8 => 1,
            Self::MinMax | Self::MinMaxFp8 => 2,
        }
    }

    /// How each summary value is stored.
    pub fn dtype(self) -> KvDtype {
        match self {
            Self::CentroidFp8 | Self::MinMaxFp8 => KvDtype::Fp8,
            Self::Centroid | Self::MinMax => KvDtype::Bf16,
        }
    }
}

/// Shared memory for `most` candidates rounded up to `CANDIDATE_BUCKET`, or for exactly
/// `most` where the bucket would pass `limit`.
fn bucketed_shared_bytes(most: usize, limit: u32) -> Result<u32, CudaError> {
    bucketed(most, topk::MAX_N, topk::shared_bytes, |&b| b <= limit)
}

/// A zeroed bf16 field of one head_dim row per KV head and pool page,
/// `[kv_head][page][head_dim]`, as the index kernels read summaries.
pub(crate) fn alloc_page_field(
    dev: &Device,
    geom: KvGeometry,
    num_pages: usize,
) -> Result<CudaSlice<bf16>, CudaError> {
    let n = geom.kv_heads * num_pages * geom.head_dim;
    dev.zeros(n)
}

/// Whether the hand-written index kernels handle `geom` with `heads_q` query heads: a warp's
/// lanes split a head_dim row in 16-byte pieces, and the query heads group over the KV heads.
pub(crate) fn check_geometry(geom: KvGeometry, heads_q: usize) -> Result<(), CudaError> {
    let d = geom.head_dim;
    if !(d.is_multiple_of(8) && d >= 8 && 32 % (d / 8) == 0) {
        return Err(CudaError::Unsupported(format!(
            "head_dim {d} for the index phase"
        )));
    }
    if heads_q == 0 || !heads_q.is_multiple_of(geom.kv_heads) {
        return Err(CudaError::Invalid(format!(
            "{heads_q} query heads over {} KV heads",
            geom.kv_heads
        )));
    }
    Ok(())
}

/// The fused index-phase kernel for one geometry and summary.
pub struct BlockTopk {
    index_fn: CudaFunction,
    /// Dynamic shared memory the kernel may take.
    shared_limit: u32,
    pub geom: KvGeometry,
    pub heads_q: usize,
    pub summary: Summary,
    /// Recall tolerance of [`launch`](Self::launch)'s top-k: 0 (the default) is exact. A
    /// model's step gives each launch its requests' own ([`RowLaunch`]).
    pub tolerance: f32,
    rows: CudaSlice<SelRow>,
    /// Rows copied by the last `load_rows`.
    loaded: usize,
    /// Whether a launch (other than one beside another flow's, which never waits) may begin
    /// while the kernel before it drains, waiting for it once its rows are read: the rows
    /// and the dense table must then have been copied from the host, not written by a kernel.
    pub dependent_launch: bool,
    /// Blocks that score each row together.
    pub split: RowSplit,
}

pub fn module_spec(geom: KvGeometry, heads_q: usize, summary: Summary) -> ModuleSpec<'static> {
    // bf16 centroids fetched two steps ahead into L2 scored 7% faster at batch 16 (H100,
    // sixty-first pass); fp8 centroids and envelopes were 3-6% slower so.
    let ahead = if summary == Summary::Centroid { 2 } else { 1 };
    ModuleSpec {
        name: "block_topk.cu",
        source: SOURCE.as_str(),
        defines: vec![
            ("HEAD_DIM", geom.head_dim.to_string()),
            ("GROUP", (heads_q / geom.kv_heads.max(1)).to_string()),
            ("SUMMARIES", summary.fields().to_string()),
            (
                "FIELD_FP8",
                ((summary.dtype() == KvDtype::Fp8) as u8).to_string(),
            ),
            // No pool is read here; kv_elem.cu is compiled for its fp8 conversions.
            ("KV_FP8", "0".into()),
            ("AHEAD", ahead.to_string()),
        ],
    }
}

impl BlockTopk {
    pub fn new(
        dev: &Device,
        geom: KvGeometry,
        heads_q: usize,
        summary: Summary,
    ) -> Result<Self, CudaError> {
        check_geometry(geom, heads_q)?;
        let built = build(dev, &module_spec(geom, heads_q, summary))?;
        let index_fn = built.function("index_select")?;
        let shared_limit = topk::allow_longest_rows(dev, &index_fn)?;
        let split = RowSplit::new(dev, &index_fn, shared_limit, true)?;
        Ok(Self {
            index_fn,
            shared_limit,
            geom,
            heads_q,
            summary,
            tolerance: 0.0,
            rows: dev.zeros(1)?,
            loaded: 0,
            dependent_launch: true,
            split,
        })
    }

    /// A zeroed summary field for a pool of `num_pages` pages, as bytes.
    pub fn alloc_field(&self, dev: &Device, num_pages: usize) -> Result<CudaSlice<u8>, CudaError> {
        let g = self.geom;
        let n = g.kv_heads * num_pages * g.head_dim * self.summary.dtype().size();
        dev.zeros(n)
    }

    /// The cache phase: the summaries of `pages` (just completed) of `kv` into `fields`
    /// ([`Summary::fields`] of them, from [`alloc_field`](Self::alloc_field)).
    pub fn summarize(
        &self,
        dev: &Device,
        kernels: &KvKernels,
        kv: &GpuLayerKv,
        pages: &PageList,
        fields: &mut [CudaSlice<u8>],
    ) -> Result<(), CudaError> {
        match (self.summary, fields) {
            (Summary::Centroid, [c]) => kernels.page_means(dev, kv, pages, c),
            (Summary::CentroidFp8, [c]) => kernels.page_means_fp8(dev, kv, pages, c),
            (Summary::MinMax, [kmax, kmin]) => kernels.page_minmax(dev, kv, pages, kmax, kmin),
            (Summary::MinMaxFp8, [kmax, kmin]) => {
                kernels.page_minmax_fp8(dev, kv, pages, kmax, kmin)
            }
            _ => Err(CudaError::Invalid(
                "summary fields do not match the flow".into(),
            )),
        }
    }

    /// Copies a step's rows to the device and makes the sparse table they write: one row per
    /// (sequence, KV head), its last page that of the sequence; into the buffers of `old` where
    /// large enough.
    pub fn prepare(
        &mut self,
        dev: &Device,
        dense: &DeviceTable,
        rows: &[SelRow],
        old: Option<DeviceTable>,
    ) -> Result<DeviceTable, CudaError> {
        self.load_rows(dev, rows)?;
        selection_table(dev, self.geom.kv_heads, dense, rows, old)
    }

    /// Copies `rows` for a launch into a table made for a step's rows of which they are part.
    pub fn load_rows(&mut self, dev: &Device, rows: &[SelRow]) -> Result<(), CudaError> {
        self.loaded = rows.len();
        upload_rows(dev, &mut self.rows, rows)
    }

    /// The device addresses a launch bakes in.
    pub fn addresses(&self, dev: &Device) -> Vec<u64> {
        vec![crate::address(dev, &self.rows)]
    }

    /// The launch's dynamic shared memory for `rows`: the longest row's candidates rounded up
    /// to `CANDIDATE_BUCKET`, or exactly where the bucket would not fit this GPU.
    pub fn shared_bytes(&self, rows: &[SelRow]) -> Result<u32, CudaError> {
        bucketed_shared_bytes(longest_candidates(rows), self.shared_limit)
    }

    /// Blocks that score each of `rows` together.
    pub fn parts(&self, rows: &[SelRow]) -> u32 {
        self.split.parts(rows.len(), longest_candidates(rows))
    }

    /// Scores the candidates and writes the selected pages into `sparse` (made by
    /// [`prepare`](Self::prepare) for these `rows`). `fields` are the flow's summaries
    /// ([`Summary::fields`] of them, stored as [`Summary::dtype`] whatever `T` says), each
    /// `[kv_head][pool page][head_dim]` for a pool of `num_pages` pages. With
    /// [`dependent_launch`](Self::dependent_launch) (the default), `dense` must have been
    /// copied from the host, not written by the kernel just before.
    #[allow(clippy::too_many_arguments)]
    pub fn launch<T: DeviceRepr>(
        &self,
        dev: &Device,
        dense: &DeviceTable,
        fields: &[&CudaSlice<T>],
        num_pages: usize,
        q: &CudaSlice<f32>,
        rows: &[SelRow],
        sparse: &mut DeviceTable,
    ) -> Result<(), CudaError> {
        let launch = RowLaunch::all(rows, self.tolerance);
        self.launch_at(dev, dense, fields, num_pages, q, launch, sparse)
    }

    /// [`launch`](Self::launch) for part of the rows copied to the device.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_at<T: DeviceRepr>(
        &self,
        dev: &Device,
        dense: &DeviceTable,
        fields: &[&CudaSlice<T>],
        num_pages: usize,
        q: &CudaSlice<f32>,
        launch: RowLaunch,
        sparse: &mut DeviceTable,
    ) -> Result<(), CudaError> {
        let RowLaunch {
            at,
            rows,
            tolerance,
            beside,
        } = launch;
        let g = self.geom;
        let need = g.kv_heads * num_pages * g.head_dim * self.summary.dtype().size();
        if fields.len() != self.summary.fields()
            || fields.iter().any(|f| f.len() * size_of::<T>() < need)
            || dense.num_pages > num_pages
        {
            return Err(CudaError::Invalid(
                "summary fields do not match the flow or the pool".into(),
            ));
        }
        if check_step(
            rows,
            self.loaded.saturating_sub(at),
            dense,
            sparse,
            q,
            (self.heads_q, g.head_dim),
        )?
        .is_none()
        {
            return Ok(());
        }
        let bytes = self.shared_bytes(rows)?;
        topk::check_shared(bytes, self.shared_limit)?;
        let (num_pages_i, heads) = (num_pages as i32, g.kv_heads as i32);
        let at_block = ready_at_block(rows, sparse);
        let (indices, ready) = sparse.selection_outputs()?;
        let mut a = RawArgs::default();
        a.buf(dev, fields[0])
            .buf(dev, fields[fields.len() - 1])
            .i32(num_pages_i)
            .buf(dev, &dense.indptr)
            .buf(dev, &dense.indices)
            .buf(dev, q)
            .addr(rows_at(dev, &self.rows, at))
            .i32(heads)
            .f32(tolerance)
            .buf(dev, indices)
            .buf(dev, ready)
            .i32(at_block)
            .i32(i32::from(self.dependent_launch && !beside));
        let parts = self.parts(rows);
        let cfg = LaunchConfig {
            grid_dim: (rows.len() as u32 * parts, 1, 1),
            block_dim: (topk::THREADS, 1, 1),
            shared_mem_bytes: bytes,
        };
        let cluster = (parts > 1).then_some((parts, 1, 1));
        // SAFETY: argument types match the kernel; rows were made from this dense table and the
        // sparse table has the slots they name; a launch beside the one before touches other
        // rows (see `RowLaunch`), and any other dependent one waits for the kernel before it
        // ahead of reading what that kernel may write or writing what it may read; the
        // clusters divide the grid.
        let dependent = beside || self.dependent_launch;
        unsafe {
            launch::launch_in_clusters(dev, &self.index_fn, cfg, &mut a, dependent, cluster)
        }?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::bucketed_shared_bytes;
    use crate::topk::MAX_N;

    #[test]
    fn shared_memory_grows_in_buckets_of_candidates() {
        let limit = (MAX_N * 4) as u32;
        // A 32K context at a 2K budget: 2046 candidates, then a page more.
        assert_eq!(bucketed_shared_bytes(2046, limit).unwrap(), 2048 * 4);
        assert_eq!(bucketed_shared_bytes(2047, limit).unwrap(), 2048 * 4);
        assert_eq!(bucketed_shared_bytes(2049, limit).unwrap(), 2304 * 4);
        assert_eq!(bucketed_shared_bytes(0, limit).unwrap(), 4);
        assert_eq!(bucketed_shared_bytes(MAX_N - 1, limit).unwrap(), limit);
        assert!(bucketed_shared_bytes(MAX_N + 1, limit).is_err());
    }

    #[test]
    fn a_bucket_past_the_gpu_limit_takes_the_exact_size() {
        // A GPU that leaves the kernel 100,000 bytes: 24,990 candidates fit, their bucket not.
        assert_eq!(bucketed_shared_bytes(24_990, 100_000).unwrap(), 24_990 * 4);
        assert_eq!(bucketed_shared_bytes(24_000, 100_000).unwrap(), 24_064 * 4);
    }
}
