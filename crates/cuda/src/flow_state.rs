//! A flow's per-request state on the device: for each layer that selects pages and each state
//! field, `[slot][kv_head][logical page][elems]` f32. A slot is zeroed when a request takes it,
//! so nothing passes from one request to the next, and it is free again when the request's
//! [`StateSlot`] drops. Each step names the slot of every sequence; index kernels read and save
//! their rows' pages there.

use cudarc::driver::CudaSlice;
use vortex_flow::state::{StateSlot, StateSlots};

use crate::error::driver;
use crate::index_row::SelRow;
use crate::{CudaError, Device, DeviceTable};

pub struct DeviceStates {
    /// Elements a page of each state field takes (per KV head).
    elems: Vec<usize>,
    kv_heads: usize,
    /// Logical pages a slot holds: the most a sequence can have.
    pub state_pages: usize,
    /// Per layer, per field, the values of `capacity` slots (`None`: the layer selects no
    /// pages and keeps no state).
    buffers: Vec<Option<Vec<CudaSlice<f32>>>>,
    capacity: usize,
    slots: StateSlots,
    /// The slot of each sequence of the step (-1: none).
    seq_slots: CudaSlice<i32>,
}

impl DeviceStates {
    /// No slots yet, for state fields of `elems` elements a page in each layer `l` where
    /// `selecting[l]`.
    pub fn new(
        dev: &Device,
        selecting: &[bool],
        kv_heads: usize,
        elems: Vec<usize>,
        state_pages: usize,
    ) -> Result<Self, CudaError> {
        let buffers = selecting
            .iter()
            .map(|&s| {
                s.then(|| elems.iter().map(|_| dev.zeros(1)).collect())
                    .transpose()
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            elems,
            kv_heads,
            state_pages: state_pages.max(1),
            buffers,
            capacity: 0,
            slots: StateSlots::default(),
            seq_slots: dev.zeros(1)?,
        })
    }

    /// Floats one slot of field `f` takes.
    fn slot_len(&self, f: usize) -> usize {
        self.kv_heads * self.state_pages * self.elems[f]
    }

    /// A zeroed slot for a new request; the buffers grow (to twice the slots) when it is past
    /// their end, keeping what the other slots hold.
    pub fn take_slot(&mut self, dev: &Device) -> Result<StateSlot, CudaError> {
        let slot = self.slots.take();
        let id = slot.id() as usize;
        let s = &dev.stream;
        let per: Vec<usize> = (0..self.elems.len()).map(|f| self.slot_len(f)).collect();
        if id >= self.capacity {
            // Every buffer grows, or none does.
            let cap = (2 * self.capacity).max(id + 1).max(4);
            let grown = self
                .buffers
                .iter()
                .map(|layer| {
                    let Some(layer) = layer else {
                        return Ok(None);
                    };
                    layer
                        .iter()
                        .enumerate()
                        .map(|(f, b)| {
                            let mut g = dev.zeros::<f32>(cap * per[f])?;
                            let old = self.capacity * per[f];
                            if old > 0 {
                                s.memcpy_dtod(&b.slice(..old), &mut g.slice_mut(..old))
                                    .map_err(driver("cuMemcpyDtoD"))?;
                            }
                            Ok(g)
                        })
                        .collect::<Result<Vec<_>, CudaError>>()
                        .map(Some)
                })
                .collect::<Result<Vec<_>, CudaError>>()?;
            self.buffers = grown;
            self.capacity = cap;
        }
        for layer in self.buffers.iter_mut().flatten() {
            for (b, &per) in layer.iter_mut().zip(&per) {
                s.memset_zeros(&mut b.slice_mut(id * per..(id + 1) * per))
                    .map_err(driver("cuMemsetD8"))?;
            }
        }
        Ok(slot)
    }

    /// Whether `slot` was taken from these states.
    pub fn owns(&self, slot: &StateSlot) -> bool {
        slot.of(&self.slots)
    }

    /// What `slot` holds of field `f` for `layer`, `[kv_head][logical page][elems]`.
    pub fn read(
        &self,
        dev: &Device,
        layer: usize,
        f: usize,
        slot: &StateSlot,
    ) -> Result<Vec<f32>, CudaError> {
        let id = slot.id() as usize;
        let b = self
            .layer(layer)?
            .get(f)
            .filter(|_| self.owns(slot) && id < self.capacity)
            .ok_or_else(|| CudaError::Invalid("no such state slot or field".into()))?;
        let per = self.slot_len(f);
        dev.stream
            .clone_dtoh(&b.slice(id * per..(id + 1) * per))
            .map_err(driver("cuMemcpyDtoH"))
    }

    /// Checks that every sequence with a row that runs the index phase has its own slot of
    /// these states and fits one, and copies each sequence's slot to the device.
    pub fn prepare(
        &mut self,
        dev: &Device,
        dense: &DeviceTable,
        rows: &[SelRow],
        slots: &[Option<&StateSlot>],
    ) -> Result<(), CudaError> {
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
        if self.seq_slots.len() < ids.len() {
            self.seq_slots = dev.zeros(ids.len())?;
        }
        if !ids.is_empty() {
            dev.upload(&ids, &mut self.seq_slots.slice_mut(..ids.len()))?;
        }
        Ok(())
    }

    /// The step's sequence slots, as [`prepare`](Self::prepare) copied them.
    pub fn seq_slots(&self) -> &CudaSlice<i32> {
        &self.seq_slots
    }

    /// The fields of `layer`.
    pub fn layer(&self, layer: usize) -> Result<&[CudaSlice<f32>], CudaError> {
        self.buffers
            .get(layer)
            .and_then(Option::as_deref)
            .ok_or_else(|| CudaError::Invalid(format!("layer {layer} keeps no state")))
    }

    /// The device addresses a launch bakes in.
    pub fn addresses(&self, dev: &Device) -> Vec<u64> {
        let mut a = vec![crate::address(dev, &self.seq_slots)];
        a.extend(
            self.buffers
                .iter()
                .flatten()
                .flatten()
                .map(|b| crate::address(dev, b)),
        );
        a
    }
}
