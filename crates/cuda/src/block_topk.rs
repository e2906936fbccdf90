//! The index phase of the built-in `block_topk`, `block_topk_fp8`, `quest` and `quest_fp8`
//! flows on the GPU, fused into one kernel per step: for each (sequence, KV head), page scores
//! from the flow's summaries, a top-k over them in shared memory (exact, or approximate with a
//! recall tolerance), and the sparse page table row, sinks and recent pages reserved, as the CPU
//! runner's `select` does. A step of few rows scores each row in a cluster of blocks
//! ([`row_parts`]).

use cudarc::driver::{CudaFunction, CudaSlice, DeviceRepr, LaunchConfig, ValidAsZeroBits};
use half::bf16;
use std::sync::LazyLock;
use vortex_flow::Settings;
use vortex_kv::{KvDtype, KvGeometry};

use crate::compile::{ModuleSpec, build};
use crate::kv_pool::KV_ELEM;
use crate::launch::{self, CLUSTER, RawArgs};
use crate::page_list::PageList;
use crate::{CudaError, Device, DeviceTable, GpuLayerKv, KvKernels, MMA, topk};

const OWN: &str = include_str!("kernels/block_topk.cu");
/// Centroid scores on the tensor cores, shared with the h2o index kernel.
pub(crate) const SCORES: &str = include_str!("kernels/scores.cu");
/// An index phase's row ([`SelRow`]) and what every index kernel does with it.
pub(crate) const INDEX_ROW: &str = include_str!("kernels/index_row.cu");
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

/// One (sequence, KV head) row of the selection, as the kernels' `SelRow` (`index_row.cu`).
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
    /// 1 when the sequence attends densely this step (every page kept, no index phase).
    pub dense: i32,
}

// SAFETY: plain `repr(C)` integers, the layout the kernels declare.
unsafe impl DeviceRepr for SelRow {}
// SAFETY: all-zero integers are a valid value.
unsafe impl ValidAsZeroBits for SelRow {}
// The kernels' `SelRow` (`index_row.cu`): eight 32-bit integers.
const _: () = assert!(size_of::<SelRow>() == 32);

/// The rows of one step from each sequence's settings, exactly as the CPU selection sizes them:
/// a sequence that is dense this step (short, a dense layer, or a budget covering it) keeps all
/// its pages.
pub fn sel_rows(
    row_pages: &[u32],
    settings: &[&Settings],
    layer: usize,
    tokens: &[usize],
    kv_heads: usize,
) -> Vec<SelRow> {
    let (mut rows, mut out) = (Vec::new(), 0usize);
    for (seq, (&pages, s)) in row_pages.iter().zip(settings).enumerate() {
        let pages = pages as usize;
        let dense = s.is_dense(layer, tokens[seq], pages);
        let (sinks, recent, k) = if dense {
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
                dense: dense as i32,
            });
            out += sinks + k + recent;
        }
    }
    rows
}

/// One index launch: `rows`, copied to the device at `at` of the flow's rows, ranked with the
/// recall `tolerance` (0: the exact top-k). With `beside`, it may start as soon as every block
/// of the kernel before it has (a dependent launch: that kernel is another flow's index launch
/// into other rows of the same table, which this one neither reads nor writes).
#[derive(Debug, Clone, Copy)]
pub struct RowLaunch<'a> {
    pub at: usize,
    pub rows: &'a [SelRow],
    pub tolerance: f32,
    pub beside: bool,
}

impl<'a> RowLaunch<'a> {
    /// All the rows copied.
    pub fn all(rows: &'a [SelRow], tolerance: f32) -> Self {
        Self {
            at: 0,
            rows,
            tolerance,
            beside: false,
        }
    }
}

/// The device address of `rows[at]`.
pub(crate) fn rows_at(dev: &Device, rows: &CudaSlice<SelRow>, at: usize) -> u64 {
    crate::address(dev, rows) + (at * size_of::<SelRow>()) as u64
}

/// Copies selection rows into `buf` (grown when needed) for an index launch.
pub fn upload_rows(
    dev: &Device,
    buf: &mut CudaSlice<SelRow>,
    rows: &[SelRow],
) -> Result<(), CudaError> {
    if buf.len() < rows.len() {
        *buf = dev.zeros(rows.len())?;
    }
    if !rows.is_empty() {
        dev.upload(rows, &mut buf.slice_mut(..rows.len()))?;
    }
    Ok(())
}

/// The sparse table a step's selection rows write (into the buffers of `old` where large
/// enough): one row per (sequence, KV head), its last page that of the sequence.
pub fn selection_table(
    dev: &Device,
    kv_heads: usize,
    dense: &DeviceTable,
    rows: &[SelRow],
    old: Option<DeviceTable>,
) -> Result<DeviceTable, CudaError> {
    let lens: Vec<u32> = rows
        .iter()
        .map(|r| (r.sinks + r.k + r.recent) as u32)
        .collect();
    let last: Vec<u32> = rows
        .iter()
        .map(|r| dense.last_len[r.seq as usize])
        .collect();
    DeviceTable::for_selection(dev, &lens, &last, kv_heads, dense, old)
}

/// Checks an index launch's `rows` against the rows buffer they were copied into (`prepared`
/// of them), the sparse table made with them and the step's queries (`heads_q` heads of
/// `head_dim` per sequence); returns the launch's dynamic shared memory, or `None` when there
/// is nothing to launch.
pub(crate) fn check_step(
    rows: &[SelRow],
    prepared: usize,
    dense: &DeviceTable,
    sparse: &DeviceTable,
    q: &CudaSlice<f32>,
    (heads_q, head_dim): (usize, usize),
) -> Result<Option<u32>, CudaError> {
    if q.len() != dense.batch * heads_q * head_dim || dense.rows_per_seq != 1 {
        return Err(CudaError::Invalid(
            "the index phase needs the dense table and one query per sequence".into(),
        ));
    }
    if rows.is_empty() {
        return Ok(None);
    }
    let slots = rows
        .iter()
        .map(|r| (r.out + r.sinks + r.k + r.recent) as usize)
        .max();
    // Each row sets the ready flag of its (sequence, KV head) row of the table: the table must
    // have those rows.
    let table_rows = sparse.row_pages.len();
    if rows.len() > prepared
        || rows.len() > table_rows
        || slots > Some(sparse.indices.len())
        || rows.iter().any(|r| {
            r.seq < 0
                || !(0..dense.kv_heads as i32).contains(&r.head)
                || r.seq as usize * dense.kv_heads + r.head as usize >= table_rows
        })
    {
        return Err(CudaError::Invalid(
            "rows and sparse table do not come from the same prepare".into(),
        ));
    }
    topk::shared_bytes(longest_candidates(rows)).map(Some)
}

/// 1 when `rows` are the rows of `sparse` in order (a selection whose rows all go to one flow
/// and tolerance): the kernel's block b then clears and sets row b's ready flag without reading
/// its row first.
pub(crate) fn ready_at_block(rows: &[SelRow], sparse: &DeviceTable) -> i32 {
    let kv_heads = sparse.kv_heads;
    let in_order = rows.len() == sparse.row_pages.len()
        && rows
            .iter()
            .enumerate()
            .all(|(i, r)| r.seq as usize * kv_heads + r.head as usize == i);
    i32::from(in_order)
}

/// The most candidates a row of `rows` ranks.
pub(crate) fn longest_candidates(rows: &[SelRow]) -> usize {
    rows.iter()
        .filter(|r| r.k > 0)
        .map(|r| (r.pages - r.sinks - r.recent).max(0) as usize)
        .max()
        .unwrap_or(0)
}

/// Candidates (pages, for h2o) the index kernels' shared memory is sized in: a step's launch
/// stays the same while its longest row grows within a bucket.
pub(crate) const CANDIDATE_BUCKET: usize = 256;

/// `size` of `most` rounded up to [`CANDIDATE_BUCKET`] (at most `cap`) where that size `fits`,
/// else of exactly `most` (an error where even that has none): how every index launch sizes
/// what it bakes into a graph.
pub(crate) fn bucketed<T>(
    most: usize,
    cap: usize,
    size: impl Fn(usize) -> Result<T, CudaError>,
    fits: impl Fn(&T) -> bool,
) -> Result<T, CudaError> {
    let exact = size(most)?;
    match size(most.next_multiple_of(CANDIDATE_BUCKET).min(cap)) {
        Ok(s) if fits(&s) => Ok(s),
        _ => Ok(exact),
    }
}

/// The most blocks that score one row together: a portable cluster.
pub const MAX_PARTS: u32 = 8;

/// Candidates of the longest row (in its bucket) a block of a split row scores at least: one
/// tile of 16 for each of its warps.
const PART_CANDIDATES: usize = 16 * (topk::THREADS as usize / 32);

/// Blocks that score each of `rows` rows together (a cluster, where the device has them), the
/// longest with `longest` candidates: 1, 2, 4 or 8. With a block a row, a step of fewer rows
/// than multiprocessors leaves the rest idle (a sequence at batch 1 has a row per KV head), so
/// a row takes up to half the multiprocessors' worth of blocks in all, and two while the rows
/// fill no more than half of them; a block scores about a tile a warp of the longest row at
/// least. Measured on an H100 (BENCHMARKS.md, the fifty-ninth and sixtieth passes): more
/// blocks, in clusters of 4 or 8, were slower than these, and 2 or 4 a row at batch 16 slower
/// than one. Candidates count in `CANDIDATE_BUCKET`s, so the split changes only where the
/// launch's shared memory does.
pub fn row_parts(rows: usize, longest: usize, sms: usize) -> u32 {
    if rows == 0 || rows * 2 > sms {
        return 1;
    }
    let by_sms = (sms / 2 / rows).max(2);
    let by_len = longest
        .next_multiple_of(CANDIDATE_BUCKET)
        .div_ceil(PART_CANDIDATES);
    let parts = by_sms.min(by_len).clamp(1, MAX_PARTS as usize);
    // Powers of two, the sizes measured.
    1 << parts.ilog2()
}

/// How many blocks of an index kernel score each row of a launch together, in a cluster.
#[derive(Clone, Copy, Debug)]
pub struct RowSplit {
    /// Blocks a row instead of [`row_parts`]' plan (None, the default); at most
    /// [`most`](Self::most).
    pub fixed: Option<u32>,
    sms: usize,
    /// The most blocks the device runs as one cluster of the kernel (1 without clusters).
    most: u32,
}

impl RowSplit {
    /// The split of `func` (launched with `shared` bytes of dynamic shared memory at most):
    /// planned where `splits`, else one block a row.
    pub(crate) fn new(
        dev: &Device,
        func: &CudaFunction,
        shared: u32,
        splits: bool,
    ) -> Result<Self, CudaError> {
        let most = if splits {
            launch::largest_cluster(dev, func, topk::THREADS, shared, MAX_PARTS)?
        } else {
            1
        };
        Ok(Self {
            fixed: None,
            sms: dev.sms,
            most,
        })
    }

    /// Blocks for each of `rows` rows, the longest of `longest` candidates.
    pub fn parts(&self, rows: usize, longest: usize) -> u32 {
        self.fixed
            .unwrap_or_else(|| row_parts(rows, longest, self.sms))
            .clamp(1, self.most.max(1))
    }

    /// The most blocks that may score a row together.
    pub fn most(&self) -> u32 {
        self.most
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
    use super::{RowSplit, bucketed_shared_bytes, row_parts};
    use crate::topk::MAX_N;

    #[test]
    fn a_fixed_split_or_the_plan_stays_within_the_cluster_the_device_runs() {
        let parts =
            |fixed, rows, longest, sms, most| RowSplit { fixed, sms, most }.parts(rows, longest);
        assert_eq!(parts(None, 8, 2046, 132, 8), 8);
        assert_eq!(parts(None, 8, 2046, 132, 4), 4);
        assert_eq!(parts(Some(8), 128, 2046, 132, 2), 2);
        assert_eq!(parts(Some(2), 128, 2046, 132, 8), 2);
        assert_eq!(parts(Some(0), 8, 2046, 132, 8), 1);
        // A device without clusters runs clusters of one.
        assert_eq!(parts(None, 8, 2046, 132, 1), 1);
    }

    #[test]
    fn few_rows_split_over_the_multiprocessors() {
        // Qwen3-8B's 8 KV heads on 132 multiprocessors: batch 1 takes 8 blocks a row, batch 2
        // four, batch 4 and 8 two, batch 16 one.
        assert_eq!(row_parts(8, 2046, 132), 8);
        assert_eq!(row_parts(16, 2046, 132), 4);
        assert_eq!(row_parts(32, 8190, 132), 2);
        assert_eq!(row_parts(64, 2046, 132), 2);
        assert_eq!(row_parts(66, 2046, 132), 2);
        assert_eq!(row_parts(67, 2046, 132), 1);
        assert_eq!(row_parts(128, 2046, 132), 1);
        // Powers of two: 12 rows would take 5, 20 rows 3.
        assert_eq!(row_parts(12, 2046, 132), 4);
        assert_eq!(row_parts(20, 2046, 132), 2);
        assert_eq!(row_parts(8, 1500, 132), 4);
        // A small GPU, and one row.
        assert_eq!(row_parts(8, 2046, 16), 2);
        assert_eq!(row_parts(9, 2046, 16), 1);
        assert_eq!(row_parts(1, 8190, 132), 8);
        // Short rows keep a tile a warp: 300 candidates are two buckets of 256, two blocks.
        assert_eq!(row_parts(8, 300, 132), 2);
        assert_eq!(row_parts(8, 100, 132), 1);
        assert_eq!(row_parts(0, 2046, 132), 1);
    }

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
