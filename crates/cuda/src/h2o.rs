//! The index phase of the built-in `h2o` flow on the GPU: heavy hitters by accumulated attention
//! mass. Each request's mass lives in a state slot on the device, per layer
//! `[slot][kv_head][logical page]` f32; a slot is zeroed when a request takes it, so no mass
//! passes from one request to the next, and it is free again when the request's
//! [`StateSlot`] drops. One kernel per layer and step scores every complete page, adds the
//! softmax over the pages (mean over the group's query heads) to the mass, saves it, and keeps
//! the top-k candidates by mass, sinks and recent pages reserved, as the CPU runner does.

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig};
use half::bf16;
use std::sync::LazyLock;
use vortex_flow::state::StateSlot;
use vortex_kv::KvGeometry;

use crate::block_topk::{SCORES, alloc_page_field, check_geometry};
use crate::compile::{ModuleSpec, build};
use crate::flow_state::DeviceStates;
use crate::index_row::{
    INDEX_ROW, RowLaunch, RowSplit, SelRow, bucketed, check_step, rows_at, selection_table,
    upload_rows,
};
use crate::launch::{self, CLUSTER, RawArgs};
use crate::{CudaError, Device, DeviceTable, MMA, topk};

const OWN: &str = include_str!("kernels/h2o.cu");
/// The top-k and centroid-scoring device code, then the index kernel.
static SOURCE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{}\n{MMA}\n{SCORES}\n{INDEX_ROW}\n{CLUSTER}\n{OWN}",
        topk::SOURCE
    )
});

pub fn module_spec(geom: KvGeometry, heads_q: usize) -> ModuleSpec<'static> {
    ModuleSpec {
        name: "h2o.cu",
        source: SOURCE.as_str(),
        defines: vec![
            ("HEAD_DIM", geom.head_dim.to_string()),
            ("GROUP", (heads_q / geom.kv_heads.max(1)).to_string()),
        ],
    }
}

pub struct HeavyHitters {
    index_fn: CudaFunction,
    /// Dynamic shared memory the kernel may take: a score per query head and a key per page.
    shared_limit: u32,
    pub geom: KvGeometry,
    pub heads_q: usize,
    /// Recall tolerance of [`launch`](Self::launch)'s top-k: 0 (the default) is exact. A
    /// model's step gives each launch its requests' own ([`RowLaunch`]).
    pub tolerance: f32,
    rows: CudaSlice<SelRow>,
    /// Rows copied by the last `load_rows`.
    loaded: usize,
    /// Each request's accumulated mass, one element a page.
    states: DeviceStates,
    /// Blocks that score each row together (planned over the pages scored).
    pub split: RowSplit,
}

impl HeavyHitters {
    /// The kernel for a model whose layer `l` selects pages where `selecting[l]` (only those
    /// keep state), for sequences of at most `state_pages` pages.
    pub fn new(
        dev: &Device,
        geom: KvGeometry,
        heads_q: usize,
        selecting: &[bool],
        state_pages: usize,
    ) -> Result<Self, CudaError> {
        check_geometry(geom, heads_q)?;
        // The kernel keeps every query head's score of each page in shared memory.
        let group = heads_q / geom.kv_heads;
        let built = build(dev, &module_spec(geom, heads_q))?;
        let index_fn = built.function("h2o_select")?;
        let shared_limit = topk::allow_longest_rows(dev, &index_fn)?;
        let split = RowSplit::new(dev, &index_fn, shared_limit, true)?;
        let longest = shared_limit as usize / (4 * (group + 1));
        if state_pages > longest {
            return Err(CudaError::Unsupported(format!(
                "h2o on the GPU over sequences of {state_pages} pages (at most {longest} with \
                 {group} query heads per KV head)"
            )));
        }
        Ok(Self {
            index_fn,
            shared_limit,
            geom,
            heads_q,
            tolerance: 0.0,
            rows: dev.zeros(1)?,
            loaded: 0,
            states: DeviceStates::new(dev, selecting, geom.kv_heads, vec![1], state_pages)?,
            split,
        })
    }

    /// Blocks that score each of `rows` together.
    pub fn parts(&self, rows: &[SelRow]) -> u32 {
        self.split.parts(rows.len(), longest_pages(rows))
    }

    /// Zeroed page centroids for a pool of `num_pages` pages, `[kv_head][page][head_dim]`.
    pub fn alloc_centroids(
        &self,
        dev: &Device,
        num_pages: usize,
    ) -> Result<CudaSlice<bf16>, CudaError> {
        alloc_page_field(dev, self.geom, num_pages)
    }

    /// A zeroed slot for a new request.
    pub fn take_slot(&mut self, dev: &Device) -> Result<StateSlot, CudaError> {
        self.states.take_slot(dev)
    }

    /// Whether `slot` was taken from this kernel's slots.
    pub fn owns(&self, slot: &StateSlot) -> bool {
        self.states.owns(slot)
    }

    /// The mass `slot` holds for `layer`, `[kv_head][logical page]`.
    pub fn mass(
        &self,
        dev: &Device,
        layer: usize,
        slot: &StateSlot,
    ) -> Result<Vec<f32>, CudaError> {
        self.states.read(dev, layer, 0, slot)
    }

    /// Copies a step's rows and each sequence's state slot to the device and makes the sparse
    /// table the rows write (into the buffers of `old` where large enough). Every sequence with
    /// a row that runs the index phase needs a slot of this kernel's.
    pub fn prepare(
        &mut self,
        dev: &Device,
        dense: &DeviceTable,
        rows: &[SelRow],
        slots: &[Option<&StateSlot>],
        old: Option<DeviceTable>,
    ) -> Result<DeviceTable, CudaError> {
        self.load_rows(dev, dense, rows, slots)?;
        selection_table(dev, self.geom.kv_heads, dense, rows, old)
    }

    /// [`prepare`](Self::prepare)'s copies alone, for `rows` that are part of a step's table.
    pub fn load_rows(
        &mut self,
        dev: &Device,
        dense: &DeviceTable,
        rows: &[SelRow],
        slots: &[Option<&StateSlot>],
    ) -> Result<(), CudaError> {
        self.states.prepare(dev, dense, rows, slots)?;
        self.loaded = rows.len();
        upload_rows(dev, &mut self.rows, rows)
    }

    /// The device addresses a launch bakes in.
    pub fn addresses(&self, dev: &Device) -> Vec<u64> {
        let mut a = vec![crate::address(dev, &self.rows)];
        a.extend(self.states.addresses(dev));
        a
    }

    /// The launch's dynamic shared memory for `rows`: for the longest row's pages rounded up to
    /// `index_row::CANDIDATE_BUCKET` (so that a step's launch stays the same while its rows grow within
    /// a bucket), or exactly where the bucket would not fit this GPU.
    pub fn shared_bytes(&self, rows: &[SelRow]) -> Result<u32, CudaError> {
        let most = longest_pages(rows);
        let per_page = 4 * (self.heads_q / self.geom.kv_heads + 1);
        bucketed_shared_bytes(most, per_page, self.shared_limit as usize)
    }

    /// The index phase of `layer`: updates the mass of each row's request and writes the
    /// selected pages into `sparse` (made by [`prepare`](Self::prepare) for these `rows`).
    /// `centroid` is `[kv_head][pool page][head_dim]` for a pool of `num_pages` pages.
    #[allow(clippy::too_many_arguments)]
    pub fn launch(
        &self,
        dev: &Device,
        layer: usize,
        dense: &DeviceTable,
        centroid: &CudaSlice<bf16>,
        num_pages: usize,
        q: &CudaSlice<f32>,
        rows: &[SelRow],
        sparse: &mut DeviceTable,
    ) -> Result<(), CudaError> {
        let launch = RowLaunch::all(rows, self.tolerance);
        self.launch_at(dev, layer, dense, centroid, num_pages, q, launch, sparse)
    }

    /// [`launch`](Self::launch) for part of the rows copied to the device.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_at(
        &self,
        dev: &Device,
        layer: usize,
        dense: &DeviceTable,
        centroid: &CudaSlice<bf16>,
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
        if centroid.len() < g.kv_heads * num_pages * g.head_dim || dense.num_pages > num_pages {
            return Err(CudaError::Invalid("centroids do not match the pool".into()));
        }
        let mass = &self.states.layer(layer)?[0];
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
        let shared = self.shared_bytes(rows)?;
        let (num_pages_i, heads, page) = (num_pages as i32, g.kv_heads as i32, g.page_size as i32);
        let state_pages = self.states.state_pages as i32;
        let at_block = crate::index_row::ready_at_block(rows, sparse);
        let (indices, ready) = sparse.selection_outputs()?;
        let mut a = RawArgs::default();
        a.buf(dev, centroid)
            .i32(num_pages_i)
            .buf(dev, &dense.indptr)
            .buf(dev, &dense.indices)
            .buf(dev, &dense.last_page_len)
            .i32(page)
            .buf(dev, q)
            .addr(rows_at(dev, &self.rows, at))
            .buf(dev, self.states.seq_slots())
            .i32(heads)
            .buf(dev, mass)
            .i32(state_pages)
            .f32(tolerance)
            .buf(dev, indices)
            .buf(dev, ready)
            .i32(at_block);
        let parts = self.parts(rows);
        let cfg = LaunchConfig {
            grid_dim: (rows.len() as u32 * parts, 1, 1),
            block_dim: (topk::THREADS, 1, 1),
            shared_mem_bytes: shared,
        };
        let cluster = (parts > 1).then_some((parts, 1, 1));
        // SAFETY: argument types match the kernel; rows were made from this dense table, each
        // sparse row's sequence has a slot within the mass buffers, and the sparse table has
        // the slots the rows name; the clusters divide the grid.
        unsafe { launch::launch_in_clusters(dev, &self.index_fn, cfg, &mut a, beside, cluster) }?;
        Ok(())
    }
}

/// The most pages a row of `rows` scores (rows that select).
fn longest_pages(rows: &[SelRow]) -> usize {
    rows.iter()
        .filter(|r| r.dense == 0)
        .map(|r| r.pages as usize)
        .max()
        .unwrap_or(0)
}

/// Shared memory for `most` pages of `per_page` bytes, the pages rounded up to
/// `index_row::CANDIDATE_BUCKET` where that fits in `limit`.
fn bucketed_shared_bytes(most: usize, per_page: usize, limit: usize) -> Result<u32, CudaError> {
    let size = |pages: usize| match pages * per_page {
        b if b > limit => Err(CudaError::Unsupported(format!(
            "h2o over {pages} pages per sequence (shared memory)"
        ))),
        b => Ok(b.max(4) as u32),
    };
    bucketed(most, usize::MAX, size, |_| true)
}

#[cfg(test)]
mod tests {
    use super::bucketed_shared_bytes;

    #[test]
    fn shared_memory_grows_in_buckets_of_pages() {
        // Qwen3-8B: 4 query heads a KV head, 20 bytes a page.
        assert_eq!(bucketed_shared_bytes(2047, 20, 232_448).unwrap(), 2048 * 20);
        assert_eq!(bucketed_shared_bytes(2049, 20, 232_448).unwrap(), 2304 * 20);
        assert_eq!(bucketed_shared_bytes(0, 20, 232_448).unwrap(), 4);
        // Past the bucket's room, exactly; past the exact, an error.
        assert_eq!(
            bucketed_shared_bytes(11_600, 20, 232_448).unwrap(),
            11_600 * 20
        );
        assert!(bucketed_shared_bytes(11_700, 20, 232_448).is_err());
    }
}
