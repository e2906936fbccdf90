//! A decode step's selections. The sparse layers that keep the same rows share one: the rows,
//! the sparse table they write, its attention plan, and the index launches that write it (one
//! per flow and recall tolerance). A step has several where its sequences keep different layers
//! dense.

use vortex_flow::Settings;
use vortex_flow::state::StateSlot;

use super::{GpuFlow, GpuModel, PlacedStep};
use crate::block_topk::{RowLaunch, SelRow, sel_rows, selection_table};
use crate::step_attention::StepAttention;
use crate::{CudaError, Device, DeviceTable};

/// Selections kept between steps whatever a step uses.
const KEPT_SELECTIONS: usize = 4;

pub(super) struct Selection {
    pub rows: Vec<SelRow>,
    pub launches: Vec<Launch>,
    /// Kept between steps so that its device addresses stay put.
    pub table: Option<DeviceTable>,
    pub attn: StepAttention,
}

/// One index launch: `rows` of flow `flow`, at `at` in the rows that flow copied to the device
/// this step, ranked with its requests' recall tolerance.
pub(super) struct Launch {
    pub flow: usize,
    pub at: usize,
    pub rows: Vec<SelRow>,
    pub tolerance: f32,
}

impl Launch {
    pub fn rows(&self) -> RowLaunch<'_> {
        RowLaunch {
            at: self.at,
            rows: &self.rows,
            tolerance: self.tolerance,
        }
    }
}

impl Selection {
    pub fn new(attn: StepAttention) -> Self {
        Self {
            rows: Vec::new(),
            launches: Vec::new(),
            table: None,
            attn,
        }
    }

    /// What a captured step bakes in from this selection.
    pub fn key(&self, dev: &Device, flows: &[&GpuFlow]) -> Vec<u64> {
        let mut key = vec![self.rows.len() as u64];
        for l in &self.launches {
            key.extend([
                l.flow as u64,
                l.at as u64,
                l.rows.len() as u64,
                l.tolerance.to_bits().into(),
            ]);
            key.extend(flows[l.flow].launch_shape(&l.rows));
        }
        if let Some(t) = &self.table {
            key.extend(t.addresses(dev));
        }
        key.extend(self.attn.launch_identity(dev));
        key
    }
}

impl GpuModel {
    /// The selections of this step (each sequence's rows from its flow and settings), their
    /// sparse tables and attention plans, and the rows each flow's index phase writes; sets
    /// which selection each layer attends through (`None`: every row dense, the dense table).
    pub(super) fn prepare_selection(
        &mut self,
        dense: &DeviceTable,
        seq_tokens: &[usize],
        batch: &[PlacedStep],
        sparse: &mut [Option<usize>],
    ) -> Result<(), CudaError> {
        self.active_selections = 0;
        // A sequence whose flow selects nothing (the model's own while it is being replaced)
        // attends densely.
        let always_dense = Settings {
            min_context: usize::MAX,
            ..Settings::default()
        };
        if let Some(s) = batch.iter().find(|s| s.flow >= self.num_flows()) {
            return Err(super::no_flow(s.flow));
        }
        let own = |i: usize| self.flow_at(i).and_then(GpuFlow::settings);
        let per_seq: Vec<&Settings> = batch
            .iter()
            .map(|s| match own(s.flow) {
                Some(own) => s.settings.unwrap_or(own),
                None => &always_dense,
            })
            .collect();
        let rows_of = |l: usize| {
            sel_rows(
                &dense.row_pages,
                &per_seq,
                l,
                seq_tokens,
                self.geom.kv_heads,
            )
        };
        // A layer's rows differ from another's only through `dense_layers`: every layer that no
        // sequence names gets the same rows, worked out once.
        let named = |l: usize| per_seq.iter().any(|s| s.dense_layers.contains(&l));
        let mut unnamed: Option<Vec<SelRow>> = None;
        let mut distinct: Vec<Vec<SelRow>> = Vec::new();
        for (l, at) in sparse.iter_mut().enumerate() {
            let own;
            let rows = if named(l) {
                own = rows_of(l);
                &own
            } else {
                &*unnamed.get_or_insert_with(|| rows_of(l))
            };
            *at = None;
            if rows.iter().all(|r| r.dense != 0) {
                continue;
            }
            *at = Some(match distinct.iter().position(|d| d == rows) {
                Some(i) => i,
                None => {
                    distinct.push(rows.clone());
                    distinct.len() - 1
                }
            });
        }
        // Each flow copies its rows of every selection to the device at once.
        let mut uploads: Vec<Vec<SelRow>> = vec![Vec::new(); self.num_flows()];
        let mut widest = vec![0; self.num_flows()];
        let mut all_launches = Vec::with_capacity(distinct.len());
        for rows in &distinct {
            let mut launches = self.launches_for(rows, batch, &per_seq)?;
            for l in &mut launches {
                l.at = uploads[l.flow].len();
                uploads[l.flow].extend_from_slice(&l.rows);
                widest[l.flow] = widest[l.flow].max(l.rows.len());
            }
            all_launches.push(launches);
        }
        for (f, rows) in uploads.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
            let slots: Vec<Option<&StateSlot>> = batch
                .iter()
                .map(|s| s.state.filter(|_| s.flow == f))
                .collect();
            let flow = match f {
                0 => &mut self.flow,
                i => &mut self.others[i - 1].gpu,
            };
            flow.load_rows(&self.dev, dense, rows, &slots, widest[f])?;
        }
        let used = distinct.len();
        // Steps with as many selections as layers are possible (a request per dense layer);
        // what a step no longer needs is given back beyond a few.
        self.selections.truncate(used.max(KEPT_SELECTIONS));
        for (i, (rows, launches)) in distinct.into_iter().zip(all_launches).enumerate() {
            if self.selections.len() == i {
                let attn = self.selections[0].attn.sibling(&self.dev)?;
                self.selections.push(Selection::new(attn));
            }
            let sel = &mut self.selections[i];
            let kv_heads = self.geom.kv_heads;
            let table = selection_table(&self.dev, kv_heads, dense, &rows, sel.table.take())?;
            sel.attn.prepare(&self.dev, &table)?;
            sel.table = Some(table);
            sel.rows = rows;
            sel.launches = launches;
        }
        self.active_selections = used;
        Ok(())
    }

    /// The index launches that write `rows`: one per flow and recall tolerance. The rows of a
    /// sequence whose flow selects nothing are all dense, and the first launch writes them.
    fn launches_for(
        &self,
        rows: &[SelRow],
        batch: &[PlacedStep],
        per_seq: &[&Settings],
    ) -> Result<Vec<Launch>, CudaError> {
        let mut launches: Vec<Launch> = Vec::new();
        let mut orphans = Vec::new();
        for r in rows {
            let seq = r.seq as usize;
            let f = batch[seq].flow;
            let Some(flow) = self.flow_at(f).filter(|f| f.settings().is_some()) else {
                orphans.push(*r);
                continue;
            };
            let tolerance = flow.tolerance_for(per_seq[seq]);
            match launches
                .iter_mut()
                .find(|l| l.flow == f && l.tolerance.to_bits() == tolerance.to_bits())
            {
                Some(l) => l.rows.push(*r),
                None => launches.push(Launch {
                    flow: f,
                    at: 0,
                    rows: vec![*r],
                    tolerance,
                }),
            }
        }
        launches.sort_by(|a, b| (a.flow, a.rows[0].seq).cmp(&(b.flow, b.rows[0].seq)));
        let first = launches
            .first_mut()
            .ok_or_else(|| CudaError::Invalid("a sparse layer with no flow to select".into()))?;
        first.rows.extend(orphans);
        // In table order, so that a launch of every row is the table's rows in order (it sets
        // each block's ready flag without reading the row first) in every step.
        first.rows.sort_by_key(|r| (r.seq, r.head));
        Ok(launches)
    }
}
