//! A flow's generated kernels ([`crate::codegen`]), compiled for the device and run over the
//! GPU pool: the cache phase into page fields, the index phase into a sparse page table.

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use vortex_flow::Flow;
use vortex_flow::state::StateSlot;
use vortex_kv::{FieldSpec, KvGeometry};

use crate::codegen;
use crate::compile::{ModuleSpec, build, warm_cache};
use crate::double_sparse::{self, LabelIndex};
use crate::error::driver;
use crate::flow_state::DeviceStates;
use crate::index_row::{
    INDEX_ROW, RowLaunch, RowSplit, SelRow, bucketed, check_step, longest_candidates, rows_at,
    selection_table, upload_rows,
};
use crate::kv_pool::{KV_ELEM, PoolDtype};
use crate::launch::{self, CLUSTER, RawArgs};
use crate::page_list::PageList;
use crate::{CudaError, Device, DeviceTable, GpuLayerKv, topk};

/// The KV pool geometry `flow` was checked for.
fn pool_geometry(flow: &Flow) -> Result<KvGeometry, CudaError> {
    let g = flow.geometry;
    KvGeometry::new(g.heads_kv, g.head_dim, g.page_size)
        .map_err(|e| CudaError::Invalid(e.to_string()))
}

/// The module's full source and defines for `flow` on a pool of `geom` storing `dtype`.
pub fn module_spec<'a>(
    flow: &Flow,
    geom: KvGeometry,
    dtype: PoolDtype,
    source: &'a str,
) -> ModuleSpec<'a> {
    ModuleSpec {
        name: "flow.cu",
        source,
        defines: vec![
            dtype.define(),
            ("HEAD_DIM", geom.head_dim.to_string()),
            ("PAGE_SIZE", geom.page_size.to_string()),
            ("GROUP", flow.geometry.group().to_string()),
        ],
    }
}

/// The pool's element type and the top-k device code, then the flow's kernels.
pub fn source(flow: &Flow) -> Result<String, CudaError> {
    let own = codegen::generate(flow)
        .map_err(|e| CudaError::Unsupported(format!("flow '{}' on the GPU: {e}", flow.name)))?;
    Ok(format!(
        "{KV_ELEM}\n{}\n{}\n{INDEX_ROW}\n{CLUSTER}\n{own}",
        topk::SOURCE,
        crate::MMA
    ))
}

/// Dynamic shared memory of a staging index phase (keys and tile), leaving room in the
/// multiprocessor's 227 KiB for the top-k's and the step values' static shared memory.
const STAGED_SHARED_BYTES: usize = 180 << 10;
/// A staged tile takes at most this much of it.
const STAGE_BYTES: usize = 128 << 10;

pub struct GeneratedFlow {
    cache_fn: CudaFunction,
    /// The cache kernel's pages and threads a block.
    cache_block: (usize, usize),
    index_fn: CudaFunction,
    /// Dynamic shared memory the index kernel may take.
    shared_limit: u32,
    pub geom: KvGeometry,
    /// The element type of the pools the cache phase reads.
    pub dtype: PoolDtype,
    pub heads_q: usize,
    pub fields: Vec<FieldSpec>,
    /// Recall tolerance of [`launch`](Self::launch)'s top-k: the flow's when its `topk` is
    /// approximate, else 0. A model's step gives each launch its requests' own ([`RowLaunch`]).
    pub tolerance: f32,
    /// Shared-memory bytes a page of a tile takes when the index phase stages its fields (both
    /// buffers).
    stage_page_bytes: Option<usize>,
    /// The built-in double_sparse's index phase on the tensor cores, used instead of the
    /// generated one where it applies.
    label_index: Option<LabelIndex>,
    rows: CudaSlice<SelRow>,
    /// Rows copied by the last `load_rows`.
    loaded: usize,
    /// Elements a page of each state field takes.
    state_elems: Vec<usize>,
    /// Each request's state, for a flow that keeps some ([`for_sequences`](Self::for_sequences)).
    states: Option<DeviceStates>,
    /// Floats a page's values kept between the passes of the index phase take (0: none kept),
    /// and the most pages of a row the scratch holds ([`for_sequences`](Self::for_sequences)).
    scratch_floats: usize,
    scratch_pages: usize,
    /// `scratch_pages` pages of kept values per row of the step.
    scratch: Option<CudaSlice<f32>>,
    /// Blocks that score each row together: one unless the index phase is generated and of
    /// one pass ([`codegen::splits_rows`]).
    pub split: RowSplit,
    pub from_cache: bool,
}

impl GeneratedFlow {
    /// Compiles what [`new`](Self::new) builds for each `(flow, dtype)` that the kernel cache
    /// lacks, on every core ([`warm_cache`]), so that their `new` then loads at once. Returns
    /// how many modules it compiled.
    pub fn warm(dev: &Device, flows: &[(&Flow, PoolDtype)]) -> Result<usize, CudaError> {
        let texts = flows
            .iter()
            .map(|(flow, _)| source(flow))
            .collect::<Result<Vec<_>, _>>()?;
        let mut specs = Vec::new();
        for ((flow, dtype), text) in flows.iter().zip(&texts) {
            specs.push(module_spec(flow, pool_geometry(flow)?, *dtype, text));
            if let Some(ids) = double_sparse::kept_channels(flow, dev.capability) {
                specs.push(double_sparse::module_spec(flow, ids.len()));
            }
        }
        warm_cache(dev, &specs)
    }

    /// Generates and compiles `flow`'s kernels for pools of `dtype` (from the disk cache when
    /// built before).
    pub fn new(dev: &Device, flow: &Flow, dtype: PoolDtype) -> Result<Self, CudaError> {
        let g = flow.geometry;
        let geom = pool_geometry(flow)?;
        let text = source(flow)?;
        let built = build(dev, &module_spec(flow, geom, dtype, &text))?;
        let f = |n: &str| built.function(n);
        let index_fn = f("flow_index")?;
        let shared_limit = topk::allow_longest_rows(dev, &index_fn)?;
        let approx = flow.index.as_ref().is_some_and(|i| i.approx);
        let label_index = LabelIndex::new(dev, flow)?;
        let splits = codegen::splits_rows(flow) && label_index.is_none();
        let split = RowSplit::new(dev, &index_fn, shared_limit, splits)?;
        Ok(Self {
            cache_fn: f("flow_cache")?,
            cache_block: codegen::cache_pages_per_block(flow),
            index_fn,
            shared_limit,
            geom,
            dtype,
            heads_q: g.heads_q,
            fields: flow.fields.clone(),
            tolerance: if approx && flow.settings.tolerance > 0.0 {
                flow.settings.tolerance_f32()
            } else {
                0.0
            },
            stage_page_bytes: codegen::stage_bytes(flow),
            label_index,
            rows: dev.zeros(1)?,
            loaded: 0,
            state_elems: flow.states.iter().map(|s| s.rows * s.cols).collect(),
            states: None,
            scratch_floats: codegen::scratch_floats(flow),
            scratch_pages: 0,
            scratch: None,
            from_cache: built.from_cache,
            split,
        })
    }

    /// Blocks that score each of `rows` together.
    pub fn parts(&self, rows: &[SelRow]) -> u32 {
        self.split.parts(rows.len(), longest_candidates(rows))
    }

    /// Room for sequences of at most `max_pages` pages in a model whose layer `l` selects pages
    /// where `selecting[l]`: each request's state there, and the values kept between passes,
    /// for a flow with either (nothing otherwise).
    pub fn for_sequences(
        mut self,
        dev: &Device,
        selecting: &[bool],
        max_pages: usize,
    ) -> Result<Self, CudaError> {
        let pages = max_pages.max(1);
        self.scratch_pages = pages;
        if !self.state_elems.is_empty() {
            let elems = self.state_elems.clone();
            self.states = Some(DeviceStates::new(
                dev,
                selecting,
                self.geom.kv_heads,
                elems,
                pages,
            )?);
        }
        Ok(self)
    }

    /// Whether the flow keeps per-request state: each sequence then needs a
    /// [`take_slot`](Self::take_slot).
    pub fn keeps_state(&self) -> bool {
        !self.state_elems.is_empty()
    }

    /// A zeroed state slot for a new request.
    pub fn take_slot(&mut self, dev: &Device) -> Result<StateSlot, CudaError> {
        self.states.as_mut().ok_or_else(no_state)?.take_slot(dev)
    }

    /// Whether `slot` was taken from this flow's state.
    pub fn owns(&self, slot: &StateSlot) -> bool {
        self.states.as_ref().is_some_and(|s| s.owns(slot))
    }

    /// What `slot` holds of state field `f` for `layer`, `[kv_head][logical page][elems]`.
    pub fn state(
        &self,
        dev: &Device,
        layer: usize,
        f: usize,
        slot: &StateSlot,
    ) -> Result<Vec<f32>, CudaError> {
        self.states
            .as_ref()
            .ok_or_else(no_state)?
            .read(dev, layer, f, slot)
    }

    /// Zeroed page fields for a pool of `num_pages` pages, laid out as the CPU's
    /// (`[kv_head][page][rows][cols]`).
    pub fn alloc_fields(
        &self,
        dev: &Device,
        num_pages: usize,
    ) -> Result<Vec<CudaSlice<u8>>, CudaError> {
        self.fields
            .iter()
            .map(|f| dev.zeros::<u8>(self.geom.kv_heads * num_pages * f.elems() * f.dtype.size()))
            .collect()
    }

    fn check_fields(&self, fields: &[CudaSlice<u8>], num_pages: usize) -> Result<(), CudaError> {
        let ok = fields.len() == self.fields.len()
            && fields.iter().zip(&self.fields).all(|(b, f)| {
                b.len() >= self.geom.kv_heads * num_pages * f.elems() * f.dtype.size()
            });
        if ok {
            Ok(())
        } else {
            Err(CudaError::Invalid(
                "page fields do not match the flow or the pool".into(),
            ))
        }
    }

    /// The cache phase over `pages` (complete pages of `kv`): every field of each page.
    pub fn summarize(
        &self,
        dev: &Device,
        kv: &GpuLayerKv,
        fields: &mut [CudaSlice<u8>],
        pages: &PageList,
    ) -> Result<(), CudaError> {
        if self.fields.is_empty() {
            return Ok(());
        }
        self.check_fields(fields, kv.num_pages)?;
        if kv.dtype != self.dtype {
            return Err(CudaError::Invalid(format!(
                "cache phase built for {} pools, given a {} one",
                self.dtype, kv.dtype
            )));
        }
        if kv.geom != self.geom {
            return Err(CudaError::Invalid(
                "cache phase: a pool of another geometry".into(),
            ));
        }
        let Some(d_pages) = pages.within(kv.num_pages)? else {
            return Ok(());
        };
        let (n, heads, num) = (
            pages.len() as i32,
            self.geom.kv_heads as i32,
            kv.num_pages as i32,
        );
        let mut l = dev.stream.launch_builder(&self.cache_fn);
        l.arg(&kv.k)
            .arg(&kv.v)
            .arg(d_pages)
            .arg(&n)
            .arg(&heads)
            .arg(&num);
        for f in fields.iter_mut() {
            l.arg(f);
        }
        let (per_block, threads) = self.cache_block;
        let cfg = LaunchConfig {
            grid_dim: (
                pages.len().div_ceil(per_block) as u32,
                self.geom.kv_heads as u32,
                1,
            ),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument types match the generated kernel; pages and field sizes were checked.
        unsafe { l.launch(cfg) }.map_err(driver("cuLaunchKernel(flow_cache)"))?;
        Ok(())
    }

    /// Copies a step's rows (and, for a flow with state, each sequence's slot) to the device
    /// and makes the sparse table they write.
    pub fn prepare(
        &mut self,
        dev: &Device,
        dense: &DeviceTable,
        rows: &[SelRow],
        slots: &[Option<&StateSlot>],
        old: Option<DeviceTable>,
    ) -> Result<DeviceTable, CudaError> {
        self.load_rows(dev, dense, rows, slots, rows.len())?;
        selection_table(dev, self.geom.kv_heads, dense, rows, old)
    }

    /// [`prepare`](Self::prepare)'s copies alone, for `rows` that are part of a step's tables
    /// and go to launches of at most `widest` rows each.
    pub fn load_rows(
        &mut self,
        dev: &Device,
        dense: &DeviceTable,
        rows: &[SelRow],
        slots: &[Option<&StateSlot>],
        widest: usize,
    ) -> Result<(), CudaError> {
        if self.keeps_state() {
            let states = self.states.as_mut().ok_or_else(no_state)?;
            states.prepare(dev, dense, rows, slots)?;
        }
        if self.scratch_floats > 0 {
            self.grow_scratch(dev, rows, widest)?;
        }
        self.loaded = rows.len();
        upload_rows(dev, &mut self.rows, rows)
    }

    /// Room in the scratch for the kept values of launches of `widest` of `rows` (it only
    /// grows, so that a captured step stays valid as long as it can).
    fn grow_scratch(
        &mut self,
        dev: &Device,
        rows: &[SelRow],
        widest: usize,
    ) -> Result<(), CudaError> {
        let longest = rows
            .iter()
            .filter(|r| r.dense == 0)
            .map(|r| r.pages as usize);
        if let Some(pages) = longest.max().filter(|&p| p > self.scratch_pages) {
            return Err(CudaError::Invalid(format!(
                "the index phase keeps values between its passes for sequences of at most {} \
                 pages, and one has {pages}",
                self.scratch_pages
            )));
        }
        let need = widest.max(1) * self.scratch_pages * self.scratch_floats;
        if self.scratch.as_ref().is_none_or(|s| s.len() < need) {
            self.scratch = Some(dev.zeros(need)?);
        }
        Ok(())
    }

    /// Pages per staged tile, and the launch's dynamic shared memory: after the longest row's
    /// `keys` bytes (16-byte aligned), a tile of as many pages as fit (their ids, and their
    /// fields in each of two buffers: one is scored while the next tile is copied into the
    /// other), up to one per thread.
    fn stage_tile(&self, keys: usize) -> Result<(i32, u32), CudaError> {
        let Some(page) = self.stage_page_bytes else {
            return Ok((0, keys as u32));
        };
        let keys = keys.next_multiple_of(16);
        let room = STAGED_SHARED_BYTES
            .min(self.shared_limit as usize)
            .saturating_sub(keys)
            .min(STAGE_BYTES);
        let tile = (room / page).min(topk::THREADS as usize);
        if tile == 0 {
            return Err(CudaError::Unsupported(format!(
                "an index phase staging {page} bytes a page beside {} candidates",
                keys / 4
            )));
        }
        Ok((tile as i32, (keys + tile * page) as u32))
    }

    /// The staged tile and dynamic shared memory of the index launch for `rows`, sized for the
    /// longest row's candidates rounded up to [`CANDIDATE_BUCKET`](crate::index_row::CANDIDATE_BUCKET) (so that a step's launch
    /// stays the same while its rows grow within a bucket), or exactly where the bucket would
    /// not fit this GPU.
    fn step_shape(&self, rows: &[SelRow]) -> Result<(i32, u32), CudaError> {
        bucketed(
            longest_candidates(rows),
            topk::MAX_N,
            |n| self.stage_tile(topk::shared_bytes(n)? as usize),
            |shape| shape.1 <= self.shared_limit,
        )
    }

    /// What the index launch for `rows` bakes in besides [`addresses`](Self::addresses): its
    /// shared memory (and staged tile), the rows themselves being read from the device.
    pub fn launch_shape(&self, rows: &[SelRow]) -> Vec<u64> {
        let shape = if self.label_index.is_some() {
            topk::shared_bytes(longest_candidates(rows)).map(|b| (0, b))
        } else {
            self.step_shape(rows)
        };
        shape.map_or(vec![0], |(tile, bytes)| {
            vec![tile as u64, bytes.into(), self.parts(rows).into()]
        })
    }

    /// The device addresses a launch bakes in.
    pub fn addresses(&self, dev: &Device) -> Vec<u64> {
        let mut a = vec![crate::address(dev, &self.rows)];
        if let Some(s) = &self.states {
            a.extend(s.addresses(dev));
        }
        if let Some(s) = &self.scratch {
            a.push(crate::address(dev, s));
        }
        a
    }

    /// The index phase of `layer`: scores each row's candidate pages (saving the state of a
    /// flow that keeps some) and writes the kept pages into `sparse` (made by
    /// [`prepare`](Self::prepare) for these `rows`).
    #[allow(clippy::too_many_arguments)]
    pub fn launch(
        &self,
        dev: &Device,
        layer: usize,
        dense: &DeviceTable,
        fields: &[CudaSlice<u8>],
        num_pages: usize,
        q: &CudaSlice<f32>,
        rows: &[SelRow],
        sparse: &mut DeviceTable,
    ) -> Result<(), CudaError> {
        let launch = RowLaunch::all(rows, self.tolerance);
        self.launch_at(dev, layer, dense, fields, num_pages, q, launch, sparse)
    }

    /// [`launch`](Self::launch) for part of the rows copied to the device.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_at(
        &self,
        dev: &Device,
        layer: usize,
        dense: &DeviceTable,
        fields: &[CudaSlice<u8>],
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
        self.check_fields(fields, num_pages)?;
        let g = self.geom;
        if dense.num_pages > num_pages {
            return Err(CudaError::Invalid(
                "the dense table was checked against a larger pool".into(),
            ));
        }
        let dims = (self.heads_q, g.head_dim);
        let prepared = self.loaded.saturating_sub(at);
        let Some(keys) = check_step(rows, prepared, dense, sparse, q, dims)? else {
            return Ok(());
        };
        if let Some(index) = &self.label_index {
            return index.launch(
                dev,
                dense,
                &fields[0],
                num_pages,
                q,
                (rows, rows_at(dev, &self.rows, at), beside),
                (g.kv_heads, tolerance, keys),
                sparse,
            );
        }
        let (stage_pages, bytes) = self.step_shape(rows)?;
        topk::check_shared(bytes, self.shared_limit)?;
        let state = match &self.states {
            Some(s) if s.layer(layer)?.len() != self.state_elems.len() => {
                return Err(CudaError::Invalid(
                    "state fields do not match the flow".into(),
                ));
            }
            Some(s) => Some((s, s.layer(layer)?)),
            None if self.keeps_state() => return Err(no_state()),
            None => None,
        };
        let (num, heads) = (num_pages as i32, g.kv_heads as i32);
        let at_block = crate::index_row::ready_at_block(rows, sparse);
        let (indices, ready) = sparse.selection_outputs()?;
        let mut a = RawArgs::default();
        a.i32(num);
        for f in fields {
            a.buf(dev, f);
        }
        a.buf(dev, &dense.indptr)
            .buf(dev, &dense.indices)
            .buf(dev, &dense.last_page_len)
            .buf(dev, q)
            .addr(rows_at(dev, &self.rows, at))
            .i32(heads)
            .f32(tolerance)
            .i32(stage_pages)
            .buf(dev, indices)
            .buf(dev, ready)
            .i32(at_block);
        let state_pages = state.map_or(0, |(s, _)| s.state_pages as i32);
        a.buf_or_null(dev, state.map(|(s, _)| s.seq_slots()))
            .i32(state_pages);
        // A flow with state has a slot store (checked above); one without takes no state field.
        for f in state.map_or(&[][..], |(_, fields)| fields) {
            a.buf(dev, f);
        }
        let scratch_pages = self.scratch_pages as i32;
        match (&self.scratch, self.scratch_floats) {
            (_, 0) => a.buf_or_null::<f32>(dev, None),
            (Some(s), _) if s.len() >= rows.len() * self.scratch_pages * self.scratch_floats => {
                a.buf(dev, s)
            }
            _ => {
                return Err(CudaError::Invalid(
                    "the index phase's scratch was not prepared for these rows".into(),
                ));
            }
        };
        a.i32(scratch_pages);
        let parts = self.parts(rows);
        let cfg = LaunchConfig {
            grid_dim: (rows.len() as u32 * parts, 1, 1),
            block_dim: (topk::THREADS, 1, 1),
            shared_mem_bytes: bytes,
        };
        let cluster = (parts > 1).then_some((parts, 1, 1));
        // SAFETY: argument types match the generated kernel; rows were made from this dense
        // table, the sparse table has the slots they name, (for a flow with state) each sparse
        // row's sequence has a slot within the state buffers that holds its pages, the scratch
        // (where used) holds `scratch_pages` pages for each row, and clusters (only where the
        // kernel splits rows) divide the grid.
        unsafe { launch::launch_in_clusters(dev, &self.index_fn, cfg, &mut a, beside, cluster) }?;
        Ok(())
    }
}

fn no_state() -> CudaError {
    CudaError::Invalid("the flow keeps per-request state, and none was made for it".into())
}
