//! The index phase of the built-in `h2o` flow on the GPU: heavy hitters by accumulated attention
//! mass. Each request's mass lives in a state slot on the device, per layer
//! `[slot][kv_head][logical page]` f32; a slot is zeroed when a request takes it, so no mass
//! passes from one request to the next, and it is free again when the request's
//! [`StateSlot`] drops. One kernel per layer and step scores every complete page, adds the
//! softmax over the pages (mean over the group's query heads) to the mass, saves it, and keeps
//! the top-k candidates by mass, sinks and recent pages reserved, as the CPU runner does.

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use half::bf16;
use std::sync::LazyLock;
use vortex_flow::state::{StateSlot, StateSlots};
use vortex_kv::KvGeometry;

use crate::block_topk::{
    INDEX_ROW, SCORES, SelRow, alloc_page_field, check_geometry, check_step, prepare_rows,
};
use crate::compile::{ModuleSpec, build};
use crate::error::driver;
use crate::{CudaError, Device, DeviceTable, MMA, topk};

const OWN: &str = include_str!("kernels/h2o.cu");
/// The top-k and centroid-scoring device code, then the index kernel.
static SOURCE: LazyLock<String> =
    LazyLock::new(|| format!("{}\n{MMA}\n{SCORES}\n{INDEX_ROW}\n{OWN}", topk::SOURCE));

/// Dynamic shared memory the kernel may take: a score per query head and a key per page.
const MAX_SHARED: usize = topk::MAX_N * 4;

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
    pub geom: KvGeometry,
    pub heads_q: usize,
    /// Recall tolerance of the top-k: 0 (the default) is exact.
    pub tolerance: f32,
    rows: CudaSlice<SelRow>,
    /// The state slot of each sequence of the step (-1: none).
    seq_slots: CudaSlice<i32>,
    /// Per layer, the accumulated mass of `capacity` slots.
    mass: Vec<CudaSlice<f32>>,
    /// Logical pages a slot holds: the most a sequence can have.
    state_pages: usize,
    capacity: usize,
    slots: StateSlots,
}

impl HeavyHitters {
    /// The kernel for `layers` layers of sequences of at most `state_pages` pages.
    pub fn new(
        dev: &Device,
        geom: KvGeometry,
        heads_q: usize,
        layers: usize,
        state_pages: usize,
    ) -> Result<Self, CudaError> {
        check_geometry(geom, heads_q)?;
        // The kernel keeps every query head's score of each page in shared memory.
        let group = heads_q / geom.kv_heads;
        let longest = MAX_SHARED / (4 * (group + 1));
        if state_pages > longest {
            return Err(CudaError::Unsupported(format!(
                "h2o on the GPU over sequences of {state_pages} pages (at most {longest} with \
                 {group} query heads per KV head)"
            )));
        }
        let built = build(dev, &module_spec(geom, heads_q))?;
        let index_fn = built.function("h2o_select")?;
        topk::allow_longest_rows(&index_fn)?;
        let s = &dev.stream;
        let alloc = driver("cuMemAlloc");
        Ok(Self {
            index_fn,
            geom,
            heads_q,
            tolerance: 0.0,
            rows: s.alloc_zeros(1).map_err(&alloc)?,
            seq_slots: s.alloc_zeros(1).map_err(&alloc)?,
            mass: (0..layers)
                .map(|_| s.alloc_zeros(1))
                .collect::<Result<_, _>>()
                .map_err(&alloc)?,
            state_pages: state_pages.max(1),
            capacity: 0,
            slots: StateSlots::default(),
        })
    }

    /// Zeroed page centroids for a pool of `num_pages` pages, `[kv_head][page][head_dim]`.
    pub fn alloc_centroids(
        &self,
        dev: &Device,
        num_pages: usize,
    ) -> Result<CudaSlice<bf16>, CudaError> {
        alloc_page_field(dev, self.geom, num_pages)
    }

    fn slot_len(&self) -> usize {
        self.geom.kv_heads * self.state_pages
    }

    /// A zeroed slot for a new request; the mass buffers grow (to twice the slots) when it is
    /// past their end, keeping what the other slots hold.
    pub fn take_slot(&mut self, dev: &Device) -> Result<StateSlot, CudaError> {
        let slot = self.slots.take();
        let id = slot.id() as usize;
        let per = self.slot_len();
        let s = &dev.stream;
        if id >= self.capacity {
            // Every layer grows, or none does.
            let cap = (2 * self.capacity).max(id + 1).max(4);
            let old = self.capacity * per;
            let grown = self
                .mass
                .iter()
                .map(|m| {
                    let mut g = s
                        .alloc_zeros::<f32>(cap * per)
                        .map_err(driver("cuMemAlloc"))?;
                    if old > 0 {
                        s.memcpy_dtod(&m.slice(..old), &mut g.slice_mut(..old))
                            .map_err(driver("cuMemcpyDtoD"))?;
                    }
                    Ok(g)
                })
                .collect::<Result<Vec<_>, CudaError>>()?;
            self.mass = grown;
            self.capacity = cap;
        }
        for m in &mut self.mass {
            s.memset_zeros(&mut m.slice_mut(id * per..(id + 1) * per))
                .map_err(driver("cuMemsetD8"))?;
        }
        Ok(slot)
    }

    /// Whether `slot` was taken from this kernel's slots.
    pub fn owns(&self, slot: &StateSlot) -> bool {
        slot.of(&self.slots)
    }

    /// The mass `slot` holds for `layer`, `[kv_head][logical page]`.
    pub fn mass(
        &self,
        dev: &Device,
        layer: usize,
        slot: &StateSlot,
    ) -> Result<Vec<f32>, CudaError> {
        let per = self.slot_len();
        let id = slot.id() as usize;
        if !self.owns(slot) || id >= self.capacity || layer >= self.mass.len() {
            return Err(CudaError::Invalid("no such state slot or layer".into()));
        }
        dev.stream
            .clone_dtoh(&self.mass[layer].slice(id * per..(id + 1) * per))
            .map_err(driver("cuMemcpyDtoH"))
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
        if slots.len() != dense.batch {
            return Err(CudaError::Invalid(
                "one state slot entry per sequence of the step".into(),
            ));
        }
        for r in rows.iter().filter(|r| r.dense == 0) {
            match slots.get(r.seq as usize).copied().flatten() {
                Some(s) if self.owns(s) && (s.id() as usize) < self.capacity => {}
                _ => {
                    return Err(CudaError::Invalid(
                        "the flow keeps per-request state: each sequence needs a state slot \
                         taken from this model"
                            .into(),
                    ));
                }
            }
            if r.pages as usize > self.state_pages {
                return Err(CudaError::Invalid(format!(
                    "a sequence of {} pages is past the {} a state slot holds",
                    r.pages, self.state_pages
                )));
            }
        }
        let ids: Vec<i32> = slots
            .iter()
            .map(|s| s.map_or(-1, |s| s.id() as i32))
            .collect();
        let mut taken: Vec<i32> = ids.iter().copied().filter(|&i| i >= 0).collect();
        taken.sort_unstable();
        if taken.windows(2).any(|w| w[0] == w[1]) {
            return Err(CudaError::Invalid(
                "two sequences of a step share a state slot".into(),
            ));
        }
        let s = &dev.stream;
        if self.seq_slots.len() < ids.len() {
            self.seq_slots = s.alloc_zeros(ids.len()).map_err(driver("cuMemAlloc"))?;
        }
        if !ids.is_empty() {
            s.memcpy_htod(&ids, &mut self.seq_slots.slice_mut(..ids.len()))
                .map_err(driver("cuMemcpyHtoD"))?;
        }
        prepare_rows(dev, &mut self.rows, self.geom.kv_heads, dense, rows, old)
    }

    /// The device addresses a launch bakes in.
    pub fn addresses(&self, dev: &Device) -> Vec<u64> {
        let mut a = vec![
            crate::address(dev, &self.rows),
            crate::address(dev, &self.seq_slots),
        ];
        a.extend(self.mass.iter().map(|m| crate::address(dev, m)));
        a
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
        let g = self.geom;
        if centroid.len() < g.kv_heads * num_pages * g.head_dim || dense.num_pages > num_pages {
            return Err(CudaError::Invalid("centroids do not match the pool".into()));
        }
        let mass = self
            .mass
            .get(layer)
            .ok_or_else(|| CudaError::Invalid(format!("no layer {layer}")))?;
        if check_step(
            rows,
            self.rows.len(),
            dense,
            sparse,
            q,
            (self.heads_q, g.head_dim),
        )?
        .is_none()
        {
            return Ok(());
        }
        let group = self.heads_q / g.kv_heads;
        let most = rows
            .iter()
            .filter(|r| r.dense == 0)
            .map(|r| (group + 1) * r.pages as usize * 4)
            .max()
            .unwrap_or(0);
        if most > MAX_SHARED {
            return Err(CudaError::Unsupported(format!(
                "h2o over {} pages per sequence (shared memory)",
                most / 4 / (group + 1)
            )));
        }
        let (num_pages_i, heads, page) = (num_pages as i32, g.kv_heads as i32, g.page_size as i32);
        let state_pages = self.state_pages as i32;
        let (indices, ready) = sparse.selection_outputs()?;
        let mut l = dev.stream.launch_builder(&self.index_fn);
        l.arg(centroid)
            .arg(&num_pages_i)
            .arg(&dense.indptr)
            .arg(&dense.indices)
            .arg(&dense.last_page_len)
            .arg(&page)
            .arg(q)
            .arg(&self.rows)
            .arg(&self.seq_slots)
            .arg(&heads)
            .arg(mass)
            .arg(&state_pages)
            .arg(&self.tolerance)
            .arg(indices)
            .arg(ready);
        let cfg = LaunchConfig {
            grid_dim: (rows.len() as u32, 1, 1),
            block_dim: (topk::THREADS, 1, 1),
            shared_mem_bytes: most.max(4) as u32,
        };
        // SAFETY: argument types match the kernel; rows were made from this dense table, each
        // sparse row's sequence has a slot within the mass buffers, and the sparse table has
        // the slots the rows name.
        unsafe { l.launch(cfg) }.map_err(driver("cuLaunchKernel(h2o_select)"))?;
        Ok(())
    }
}
