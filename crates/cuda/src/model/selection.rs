//! A decode step's selections. The sparse layers that keep the same rows share one: the rows,
//! the sparse table they write, its attention plan, and the index launches that write it (one
//! per flow and recall tolerance). A step has several where its sequences keep different layers
//! dense.

use vortex_flow::Settings;
use vortex_flow::state::StateSlot;

use super::{GpuFlow, GpuModel, PlacedStep};
use crate::index_row::{RowLaunch, SelRow, sel_rows, selection_table};
use crate::step_attention::StepAttention;
use crate::{CudaError, Device, DeviceTable};

/// Selections kept between steps whatever a step uses.
const KEPT_SELECTIONS: usize = 4;

pub(super) struct Selection {
    /// Every row of the table, each in one launch.
    pub launches: Vec<Launch>,
    /// Kept between steps so that its device addresses stay put.
    pub table: Option<DeviceTable>,
    pub attn: StepAttention,
}

/// One index launch: `rows` of flow `flow`, at `at` in the rows that flow copied to the device
/// this step, ranked with its requests' recall tolerance. A launch of another flow than the one
/// before it runs `beside` it (a flow's own launches share its buffers: they run in turn).
pub(super) struct Launch {
    pub flow: usize,
    pub at: usize,
    pub rows: Vec<SelRow>,
    pub tolerance: f32,
    pub beside: bool,
}

impl Launch {
    pub fn rows(&self) -> RowLaunch<'_> {
        RowLaunch {
            at: self.at,
            rows: &self.rows,
            tolerance: self.tolerance,
            beside: self.beside && !crate::attention::waits_whole_index(),
        }
    }
}

impl Selection {
    pub fn new(attn: StepAttention) -> Self {
        Self {
            launches: Vec::new(),
            table: None,
            attn,
        }
    }

    /// What a captured step bakes in from this selection.
    pub fn key(&self, dev: &Device, flows: &[&GpuFlow]) -> Vec<u64> {
        let mut key = Vec::new();
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
        // A layer's rows differ from another's only through `dense_layers`.
        let named = |l: usize| per_seq.iter().any(|s| s.dense_layers.contains(&l));
        let slides = |l: usize| self.config.window(l).is_some();
        let distinct = assign_selections(sparse, slides, named, rows_of);
        // Each sequence's launch: its flow's, at its recall tolerance.
        let key = |seq: usize| {
            let f = batch[seq].flow;
            let flow = self.flow_at(f).filter(|f| f.settings().is_some())?;
            Some((f, flow.tolerance_for(per_seq[seq])))
        };
        let mut all_launches = distinct
            .iter()
            .map(|rows| launches_for(rows, key))
            .collect::<Result<Vec<_>, _>>()?;
        let (uploads, widest) = place(&mut all_launches, self.num_flows());
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
            sel.launches = launches;
        }
        self.active_selections = used;
        Ok(())
    }
}

/// Points each sparse layer at its selection among the distinct rows `rows_of` gives (`None`:
/// every row dense, so the layer attends through the dense table, or the layer `slides` a
/// window and selects nothing); returns those rows. Layers `named` by no sequence's dense
/// layers have the same rows, worked out once.
fn assign_selections(
    sparse: &mut [Option<usize>],
    slides: impl Fn(usize) -> bool,
    named: impl Fn(usize) -> bool,
    rows_of: impl Fn(usize) -> Vec<SelRow>,
) -> Vec<Vec<SelRow>> {
    let mut unnamed: Option<Vec<SelRow>> = None;
    let mut distinct: Vec<Vec<SelRow>> = Vec::new();
    for (l, at) in sparse.iter_mut().enumerate() {
        *at = None;
        if slides(l) {
            continue;
        }
        let own;
        let rows = if named(l) {
            own = rows_of(l);
            &own
        } else {
            &*unnamed.get_or_insert_with(|| rows_of(l))
        };
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
    distinct
}

/// The index launches that write `rows`: one per (flow, recall tolerance) that `key` gives a
/// row's sequence. The rows of a sequence whose flow selects nothing (`None`) are all dense,
/// and the first launch writes them.
fn launches_for(
    rows: &[SelRow],
    key: impl Fn(usize) -> Option<(usize, f32)>,
) -> Result<Vec<Launch>, CudaError> {
    let mut launches: Vec<Launch> = Vec::new();
    let mut orphans = Vec::new();
    for r in rows {
        let Some((flow, tolerance)) = key(r.seq as usize) else {
            orphans.push(*r);
            continue;
        };
        match launches
            .iter_mut()
            .find(|l| l.flow == flow && l.tolerance.to_bits() == tolerance.to_bits())
        {
            Some(l) => l.rows.push(*r),
            None => launches.push(Launch {
                flow,
                at: 0,
                rows: vec![*r],
                tolerance,
                beside: false,
            }),
        }
    }
    launches.sort_by(|a, b| (a.flow, a.rows[0].seq).cmp(&(b.flow, b.rows[0].seq)));
    let first = launches
        .first_mut()
        .ok_or_else(|| CudaError::Invalid("a sparse layer with no flow to select".into()))?;
    first.rows.extend(orphans);
    // In table order, so that a launch of every row is the table's rows in order (it sets each
    // block's ready flag without reading the row first) in every step.
    first.rows.sort_by_key(|r| (r.seq, r.head));
    for i in 1..launches.len() {
        launches[i].beside = launches[i].flow != launches[i - 1].flow;
    }
    Ok(launches)
}

/// Places every selection's launches in their flows' copies, one after another; returns each of
/// `flows` flows' rows to copy and the most rows one of its launches reads.
fn place(selections: &mut [Vec<Launch>], flows: usize) -> (Vec<Vec<SelRow>>, Vec<usize>) {
    let mut uploads: Vec<Vec<SelRow>> = vec![Vec::new(); flows];
    let mut widest = vec![0; flows];
    for l in selections.iter_mut().flatten() {
        l.at = uploads[l.flow].len();
        uploads[l.flow].extend_from_slice(&l.rows);
        widest[l.flow] = widest[l.flow].max(l.rows.len());
    }
    (uploads, widest)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two KV heads a sequence; `dense` sequences keep every one of their 8 pages.
    fn rows(seqs: usize, dense: &[usize]) -> Vec<SelRow> {
        let mut out = 0;
        (0..seqs as i32)
            .flat_map(|seq| (0..2).map(move |head| (seq, head)))
            .map(|(seq, head)| {
                let d = dense.contains(&(seq as usize));
                let (sinks, recent, k) = if d { (8, 0, 0) } else { (1, 1, 2) };
                let r = SelRow {
                    seq,
                    head,
                    pages: 8,
                    sinks,
                    recent,
                    k,
                    out,
                    dense: i32::from(d),
                };
                out += sinks + k + recent;
                r
            })
            .collect()
    }

    #[test]
    fn layers_with_the_same_rows_share_a_selection() {
        // Sequence 0 keeps layer 1 dense, sequence 1 layers 1 and 3; layer 2 all of them.
        let dense_at = |l: usize| match l {
            1 => vec![0, 1],
            2 => vec![0, 1, 2],
            3 => vec![1],
            _ => vec![],
        };
        let named = |l: usize| l != 0 && l != 4;
        let mut sparse = vec![Some(9); 5];
        let distinct = assign_selections(&mut sparse, |_| false, named, |l| rows(3, &dense_at(l)));
        assert_eq!(sparse, [Some(0), Some(1), None, Some(2), Some(0)]);
        assert_eq!(distinct, [rows(3, &[]), rows(3, &[0, 1]), rows(3, &[1])]);
        // Sliding-window layers (1 and 3 here) select nothing and add no rows.
        let mut sparse = vec![Some(9); 5];
        let distinct = assign_selections(
            &mut sparse,
            |l| l % 2 == 1,
            named,
            |l| rows(3, &dense_at(l)),
        );
        assert_eq!(sparse, [Some(0), None, None, None, Some(0)]);
        assert_eq!(distinct, [rows(3, &[])]);
    }

    #[test]
    fn rows_go_to_a_launch_per_flow_and_tolerance() {
        // Sequences 0 and 3 run flow 1, 1 flow 0, 2 flow 0 at tolerance 0.5, 4 a flow that
        // selects nothing.
        let all = rows(5, &[4]);
        let key = |seq: usize| match seq {
            0 | 3 => Some((1, 0.0)),
            1 => Some((0, 0.0)),
            2 => Some((0, 0.5)),
            _ => None,
        };
        let launches = launches_for(&all, key).unwrap();
        let seqs = |l: &Launch| l.rows.iter().map(|r| (r.seq, r.head)).collect::<Vec<_>>();
        let got: Vec<_> = launches
            .iter()
            .map(|l| (l.flow, l.tolerance, l.beside))
            .collect();
        // Flow 1's launch runs beside flow 0's; flow 0's two in turn.
        assert_eq!(got, [(0, 0.0, false), (0, 0.5, false), (1, 0.0, true)]);
        // The first launch also writes the dense rows of sequence 4, in table order.
        assert_eq!(seqs(&launches[0]), [(1, 0), (1, 1), (4, 0), (4, 1)]);
        assert_eq!(seqs(&launches[1]), [(2, 0), (2, 1)]);
        assert_eq!(seqs(&launches[2]), [(0, 0), (0, 1), (3, 0), (3, 1)]);
        // Each row once.
        assert_eq!(
            launches.iter().map(|l| l.rows.len()).sum::<usize>(),
            all.len()
        );

        // One flow: a single launch of every row, in table order.
        let one = launches_for(&all, |_| Some((0, 0.0))).unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].rows, all);
        assert!(launches_for(&all, |_| None).is_err());
    }

    #[test]
    fn each_flow_copies_its_launches_one_after_another() {
        let first = rows(2, &[]);
        let second = rows(2, &[0]);
        let by_seq = |seq: usize| Some((seq, 0.0));
        let mut all = vec![
            launches_for(&first, by_seq).unwrap(),
            launches_for(&second, by_seq).unwrap(),
        ];
        let (uploads, widest) = place(&mut all, 3);
        assert_eq!(widest, [2, 2, 0]);
        assert!(uploads[2].is_empty());
        for launch in all.iter().flatten() {
            let at = launch.at;
            assert_eq!(
                uploads[launch.flow][at..at + launch.rows.len()],
                launch.rows[..]
            );
        }
        assert_eq!(all[1][0].at, 2);
        assert_eq!(uploads[0].len(), 4);
    }
}
