//! An index phase's rows: one (sequence, KV head) row of a step's selection, sized as the CPU
//! selection sizes it, and what every index kernel (block_topk's, h2o's, double_sparse's and
//! the generated ones) does with its rows: copying them to the device, the sparse table they
//! write, checking a launch, sizing its shared memory in buckets of candidates, and splitting a
//! row over a cluster of blocks. Its device side is `kernels/index_row.cu`.

use cudarc::driver::{CudaFunction, CudaSlice, DeviceRepr, ValidAsZeroBits};
use vortex_flow::Settings;

use crate::launch;
use crate::{CudaError, Device, DeviceTable, topk};

/// An index phase's row ([`SelRow`]) and what every index kernel does with it.
pub(crate) const INDEX_ROW: &str = include_str!("kernels/index_row.cu");

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

#[cfg(test)]
mod tests {
    use super::{RowSplit, row_parts};

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
}
