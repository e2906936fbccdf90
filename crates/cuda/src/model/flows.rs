//! The flows a GPU model decodes with: its own, and others loaded beside it for the requests
//! that choose them, each with its summaries and per-request state.

use vortex_flow::Flow;
use vortex_flow::state::StateSlot;
use vortex_kv::Sequence;

use super::{GpuFlow, GpuModel};
use crate::CudaError;
use crate::page_list::PageList;

/// A flow loaded beside the model's own, for the sequences that choose it: its definition (to
/// rebuild it with a new pool) and its kernels and summaries.
pub struct OtherFlow {
    pub def: Flow,
    pub gpu: GpuFlow,
}

impl GpuModel {
    /// Loads `flow` beside the others for the sequences that choose it, its cache phase run over
    /// the complete pages of `seqs` (every sequence that may decode with it); returns its index
    /// for [`PlacedStep::flow`](super::PlacedStep::flow). Its summaries of every page of the
    /// pool take device memory: [`fill_memory`](Self::fill_memory) can leave room for them.
    pub fn add_flow(&mut self, flow: &Flow, seqs: &[&Sequence]) -> Result<usize, CudaError> {
        let room_left = match &mut self.keep_free {
            Some((_, room)) => room
                .iter()
                .position(|n| *n == flow.name)
                .map(|i| room.remove(i))
                .is_some(),
            None => true,
        };
        self.push_flow(flow, seqs, !room_left)
    }

    /// [`add_flow`](Self::add_flow); with `check_memory`, refused where its summaries would
    /// leave less device memory free than [`fill_memory`](Self::fill_memory) keeps.
    pub(super) fn push_flow(
        &mut self,
        flow: &Flow,
        seqs: &[&Sequence],
        check_memory: bool,
    ) -> Result<usize, CudaError> {
        let mut gpu = self.new_flow(flow, self.allocator.total())?;
        // A flow without summaries (dense) takes nothing from the pool's share.
        let takes = gpu.summary_bytes() > 0;
        if let Some((keep, _)) = self.keep_free.as_ref().filter(|_| check_memory && takes) {
            let (free, _) = self.dev.memory_info()?;
            if free < *keep {
                return Err(CudaError::Invalid(format!(
                    "its summaries would leave {} MiB of device memory free, under the {} MiB \
                     the memory share and the running headroom keep",
                    free >> 20,
                    keep >> 20
                )));
            }
        }
        self.summarize_all(&mut gpu, seqs)?;
        self.graphs.clear();
        self.generation += 1;
        self.others.push(OtherFlow {
            def: flow.clone(),
            gpu,
        });
        Ok(self.others.len())
    }

    /// `flow`'s kernels, with summaries for a pool of `num_pages` pages.
    pub(super) fn new_flow(&self, flow: &Flow, num_pages: usize) -> Result<GpuFlow, CudaError> {
        let selecting = self.config.selecting_layers();
        GpuFlow::new(
            &self.dev,
            flow,
            self.geom,
            self.kv_dtype,
            &selecting,
            num_pages,
            self.geom.pages_for(self.config.max_positions),
        )
    }

    /// The flow of index `i` (0 the model's own, then [`add_flow`](Self::add_flow)'s).
    pub fn flow_at(&self, i: usize) -> Option<&GpuFlow> {
        flow_in(&self.flow, &self.others, i)
    }

    /// Loaded flows, the model's own first.
    pub fn num_flows(&self) -> usize {
        1 + self.others.len()
    }

    /// Runs `flow`'s cache phase over the complete pages of `seqs`, every layer that keeps
    /// summaries.
    pub(super) fn summarize_all(
        &self,
        flow: &mut GpuFlow,
        seqs: &[&Sequence],
    ) -> Result<(), CudaError> {
        let page = self.geom.page_size;
        let mut complete: Vec<u32> = Vec::new();
        for s in seqs {
            let pages = s.pages.get(..s.complete_pages(page)).ok_or_else(|| {
                CudaError::Invalid("a sequence has fewer pages than its tokens need".into())
            })?;
            complete.extend_from_slice(pages);
        }
        if !complete.is_empty() {
            let complete = PageList::new(&self.dev, &complete)?;
            for (l, kv) in self.kv.iter().enumerate() {
                flow.summarize(&self.dev, &self.kv_kernels, l, kv, &complete)?;
            }
        }
        Ok(())
    }

    /// Decodes with `flow` from now on, its cache phase run over the complete pages of `seqs`.
    pub fn set_flow(&mut self, flow: &Flow, seqs: &[&Sequence]) -> Result<(), CudaError> {
        self.graphs.clear();
        self.generation += 1;
        self.flow = GpuFlow::Dense;
        let mut gpu = self.new_flow(flow, self.allocator.total())?;
        self.summarize_all(&mut gpu, seqs)?;
        self.flow = gpu;
        Ok(())
    }

    /// A zeroed state slot for a new request when the flow keeps per-request state (`h2o`),
    /// `None` otherwise. The slot is free again once its handle and every clone of it drop.
    pub fn state_slot(&mut self) -> Result<Option<StateSlot>, CudaError> {
        self.state_slot_for(0)
    }

    /// [`state_slot`](Self::state_slot) for a sequence that decodes with flow `i`.
    pub fn state_slot_for(&mut self, i: usize) -> Result<Option<StateSlot>, CudaError> {
        let flow = match i {
            0 => &mut self.flow,
            i => &mut self.others.get_mut(i - 1).ok_or_else(|| no_flow(i))?.gpu,
        };
        flow.state_slot(&self.dev)
    }
}

/// The flow of index `i` among the model's own (0) and the others.
pub(super) fn flow_in<'a>(
    own: &'a GpuFlow,
    others: &'a [OtherFlow],
    i: usize,
) -> Option<&'a GpuFlow> {
    match i {
        0 => Some(own),
        i => others.get(i - 1).map(|o| &o.gpu),
    }
}

pub(super) fn no_flow(i: usize) -> CudaError {
    CudaError::Invalid(format!("no flow {i} is loaded on this GPU model"))
}
