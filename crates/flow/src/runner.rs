//! Runs a checked flow over a batch: the cache phase on completed pages, the index phase and
//! page selection at every decode step, on all cores.

use rayon::prelude::*;
use vortex_kernels::topk::TopkScratch;
use vortex_kv::vtensor::VTensor;
use vortex_kv::{F8E4M3, KvDtype, KvElem, LayerKv, PageFields, PageId, PageTable, Sequence};

use crate::Settings;
use crate::exec::{Leaves, Program, Scratch};
use crate::ir::{Flow, Input, Op};
use crate::ops::{Widen, dot_pair, dot_stored, envelope_rows, fold_field_rows};
use crate::plan::{FieldFold, Plan};
use crate::select::select_pages;
use crate::state::LayerState;

/// How far ahead of use the index phase fetches page summaries (they are scattered by page).
const PREFETCH_PAGES: usize = 24;

/// Pages summarised per cache-phase work item.
const CACHE_CHUNK: usize = 64;

/// A flow with its phases planned.
pub struct FlowRunner {
    pub flow: Flow,
    cache_plan: Option<Plan>,
    index_plan: Option<Plan>,
}

/// One sequence of a decode step.
pub struct StepSeq<'a> {
    pub seq: &'a Sequence,
    pub settings: &'a Settings,
    /// This request's state for the layer; required when the flow declares state.
    pub state: Option<&'a mut LayerState>,
}

/// What one step's selection did, for metrics and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepStats {
    /// Sequence x KV-head rows that ran the index phase.
    pub sparse_rows: usize,
    /// Rows that attend to every page.
    pub dense_rows: usize,
    /// Pages listed in the table.
    pub pages_selected: usize,
}

impl FlowRunner {
    pub fn new(flow: Flow) -> Self {
        let cache_plan = flow.cache.as_ref().map(|c| {
            let outs: Vec<usize> = c.outputs.iter().map(|o| o.1).collect();
            Plan::new(&c.graph, &outs)
        });
        let index_plan = flow.index.as_ref().map(|ix| {
            let mut outs: Vec<usize> = ix.saves.iter().map(|s| s.1).collect();
            outs.push(ix.score);
            Plan::new(&ix.graph, &outs)
        });
        Self {
            flow,
            cache_plan,
            index_plan,
        }
    }

    pub fn cache_plan(&self) -> Option<&Plan> {
        self.cache_plan.as_ref()
    }

    pub fn index_plan(&self) -> Option<&Plan> {
        self.index_plan.as_ref()
    }

    /// Storage for one layer's page summaries.
    pub fn new_fields(&self, num_pages: usize) -> PageFields {
        PageFields::new(
            self.flow.fields.clone(),
            self.flow.geometry.heads_kv,
            num_pages,
        )
    }

    /// A request's state for `num_layers` layers.
    pub fn new_state(&self, num_layers: usize) -> crate::state::RequestState {
        crate::state::RequestState::new(num_layers, self.flow.states.len())
    }

    /// Runs the cache phase on complete `pages` of `layer` for every KV head.
    pub fn summarize(&self, layer: &LayerKv, fields: &mut PageFields, pages: &[PageId]) {
        let (Some(cache), Some(plan)) = (&self.flow.cache, &self.cache_plan) else {
            return;
        };
        let heads = self.flow.geometry.heads_kv;
        let prog = Program {
            graph: &cache.graph,
            plan,
            consts: &self.flow.consts,
        };
        let items: Vec<(usize, &[PageId])> = (0..heads)
            .flat_map(|h| pages.chunks(CACHE_CHUNK).map(move |c| (h, c)))
            .collect();
        let results: Vec<SummaryChunk> = items
            .into_par_iter()
            .map(|(head, chunk)| {
                with_scratch(|scratch| {
                    let leaves = CacheLeaves {
                        layer,
                        pages: chunk,
                        head,
                    };
                    prog.run(&leaves, chunk.len(), scratch);
                    let outs = cache
                        .outputs
                        .iter()
                        .map(|&(f, id)| {
                            let spec = &self.flow.fields[f];
                            expand(prog.value(scratch, id), chunk.len(), spec.rows, spec.cols)
                        })
                        .collect();
                    (head, chunk, outs)
                })
            })
            .collect();
        for (head, chunk, outs) in results {
            for (&(f, _), data) in cache.outputs.iter().zip(&outs) {
                let e = self.flow.fields[f].elems();
                for (&page, blk) in chunk.iter().zip(data.chunks(e)) {
                    fields.write(f, page, head, blk);
                }
            }
        }
    }

    /// Index-phase scores of every complete page, per `(sequence, KV head)` row
    /// (`seq * heads_kv + head`); empty for rows that attend densely this step.
    /// Updates each request's state as the flow saves it.
    pub fn scores(
        &self,
        layer: usize,
        fields: &PageFields,
        q: &[f32],
        batch: &mut [StepSeq],
    ) -> Vec<Vec<f32>> {
        self.index_rows(layer, fields, q, batch, |_, score| score.to_vec())
            .into_iter()
            .map(Option::unwrap_or_default)
            .collect()
    }

    /// Runs the index phase for every sparse `(sequence, KV head)` row on the worker threads
    /// and hands each row's scores to `keep` there, while they are in cache; `None` for rows
    /// that attend densely this step, and for every row of a flow without an index phase.
    /// Updates each request's state as the flow saves it.
    fn index_rows<R: Send>(
        &self,
        layer: usize,
        fields: &PageFields,
        q: &[f32],
        batch: &mut [StepSeq],
        keep: impl Fn(&StepSeq, &[f32]) -> R + Sync,
    ) -> Vec<Option<R>> {
        let g = self.flow.geometry;
        let heads = g.heads_kv;
        let rows = batch.len() * heads;
        let (Some(index), Some(plan)) = (&self.flow.index, &self.index_plan) else {
            return (0..rows).map(|_| None).collect();
        };
        let p = g.page_size;
        let state_elems: Vec<usize> = self.flow.states.iter().map(|s| s.rows * s.cols).collect();
        for s in batch.iter_mut() {
            if let Some(st) = s.state.as_deref_mut() {
                st.ensure(s.seq.complete_pages(p), heads, &state_elems);
            }
        }
        let prog = Program {
            graph: &index.graph,
            plan,
            consts: &self.flow.consts,
        };
        let qstride = g.heads_q * g.head_dim;
        let group = g.group() * g.head_dim;
        let work: Vec<(usize, usize)> = batch
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.settings.is_dense(layer, s.seq.len, s.seq.pages.len()))
            .flat_map(|(b, _)| (0..heads).map(move |h| (b, h)))
            .collect();
        let states: Vec<Option<&LayerState>> = batch.iter().map(|s| s.state.as_deref()).collect();
        let results: Vec<RowResult<R>> = work
            .into_par_iter()
            .map(|(b, head)| {
                with_scratch(|scratch| {
                    let seq = batch[b].seq;
                    let n = seq.complete_pages(p);
                    let leaves = IndexLeaves {
                        fields,
                        pages: &seq.pages[..n],
                        head,
                        heads,
                        q: &q[b * qstride + head * group..][..group],
                        state: states[b],
                        state_elems: &state_elems,
                    };
                    prog.run(&leaves, n, scratch);
                    let kept = keep(&batch[b], &prog.value(scratch, index.score).data[..n]);
                    let saves = index
                        .saves
                        .iter()
                        .map(|&(s, id)| {
                            let spec = &self.flow.states[s];
                            expand(prog.value(scratch, id), n, spec.rows, spec.cols)
                        })
                        .collect();
                    (b, head, kept, saves)
                })
            })
            .collect();
        let mut out: Vec<Option<R>> = (0..rows).map(|_| None).collect();
        for (b, head, kept, saves) in results {
            if let Some(st) = batch[b].state.as_deref_mut() {
                for (&(s, _), data) in index.saves.iter().zip(&saves) {
                    let (e, dst) = (state_elems[s], &mut st.fields[s]);
                    if e == 1 {
                        // One value a page (h2o's mass): stores, not a copy call each.
                        for (page, &x) in data.iter().enumerate() {
                            dst[page * heads + head] = x;
                        }
                    } else {
                        for (page, blk) in data.chunks(e).enumerate() {
                            dst[(page * heads + head) * e..][..e].copy_from_slice(blk);
                        }
                    }
                }
            }
            out[b * heads + head] = Some(kept);
        }
        out
    }

    /// Runs the index phase and writes this step's page table for `layer`: one row per
    /// `(sequence, KV head)`. Returns what was selected. Each row's top-k runs on the worker
    /// that scored it; the result is that of [`scores`](Self::scores) then
    /// [`table_from_scores`](Self::table_from_scores).
    pub fn select(
        &self,
        layer: usize,
        fields: &PageFields,
        q: &[f32],
        batch: &mut [StepSeq],
        table: &mut PageTable,
    ) -> StepStats {
        if self.flow.index.is_none() {
            return self.table_from_scores(layer, batch, &[], table);
        }
        let picks: Vec<Option<Vec<PageId>>> = self
            .index_rows(layer, fields, q, batch, |s, score| {
                self.pick(layer, s, Some(score))
            })
            .into_iter()
            .map(Option::flatten)
            .collect();
        if self.all_dense(layer, batch) {
            return self.dense_table(batch, table);
        }
        self.fill_table(batch, &picks, table)
    }

    /// Builds the page table from [`scores`](Self::scores) (unread for a flow without an
    /// index phase, or when every sequence attends densely).
    pub fn table_from_scores(
        &self,
        layer: usize,
        batch: &[StepSeq],
        scores: &[Vec<f32>],
        table: &mut PageTable,
    ) -> StepStats {
        let heads = self.flow.geometry.heads_kv;
        if self.all_dense(layer, batch) {
            return self.dense_table(batch, table);
        }
        // Each row's top-k on the worker threads, rows in order.
        let picks: Vec<Option<Vec<PageId>>> = (0..batch.len() * heads)
            .into_par_iter()
            .map(|row| {
                let scored = self.flow.index.as_ref().map(|_| scores[row].as_slice());
                self.pick(layer, &batch[row / heads], scored)
            })
            .collect();
        self.fill_table(batch, &picks, table)
    }

    /// One row per sequence, shared by all KV heads: attention then streams each page once for
    /// every head.
    fn dense_table(&self, batch: &[StepSeq], table: &mut PageTable) -> StepStats {
        let g = self.flow.geometry;
        let seqs: Vec<&Sequence> = batch.iter().map(|s| s.seq).collect();
        *table = PageTable::dense(&seqs, g.page_size);
        StepStats {
            dense_rows: batch.len() * g.heads_kv,
            pages_selected: g.heads_kv * seqs.iter().map(|s| s.pages.len()).sum::<usize>(),
            ..StepStats::default()
        }
    }

    fn all_dense(&self, layer: usize, batch: &[StepSeq]) -> bool {
        batch
            .iter()
            .all(|s| s.settings.is_dense(layer, s.seq.len, s.seq.pages.len()))
    }

    /// The pool pages one row of `s` keeps, from its scores (`None`: a flow without an index
    /// phase keeps its sinks and most recent pages); `None` where `s` attends densely.
    fn pick(&self, layer: usize, s: &StepSeq, scores: Option<&[f32]>) -> Option<Vec<PageId>> {
        let pages = s.seq.pages.len();
        if s.settings.is_dense(layer, s.seq.len, pages) {
            return None;
        }
        let approx = self.flow.index.as_ref().is_some_and(|ix| ix.approx);
        SELECT.with_borrow_mut(|(scratch, picked, logical)| {
            select_pages(s.settings, pages, scores, approx, scratch, picked, logical);
            Some(logical.iter().map(|&i| s.seq.pages[i]).collect())
        })
    }

    /// A sparse table of one row per `(sequence, KV head)`: each row's picked pages, or all of
    /// the sequence's where it attends densely (`None`).
    fn fill_table(
        &self,
        batch: &[StepSeq],
        picks: &[Option<Vec<PageId>>],
        table: &mut PageTable,
    ) -> StepStats {
        let g = self.flow.geometry;
        let heads = g.heads_kv;
        let mut stats = StepStats::default();
        *table = PageTable::new(heads);
        for (s, picks) in batch.iter().zip(picks.chunks(heads)) {
            let last = s.seq.last_page_len(g.page_size);
            for pick in picks {
                let row = pick.as_deref().unwrap_or(&s.seq.pages);
                table.push_row(row, last);
                match pick {
                    Some(_) => stats.sparse_rows += 1,
                    None => stats.dense_rows += 1,
                }
                stats.pages_selected += row.len();
            }
        }
        stats
    }
}

/// Summaries of one KV head's run of pages: `(head, pages, per field values)`.
type SummaryChunk<'a> = (usize, &'a [PageId], Vec<Vec<f32>>);
/// What one `(sequence, KV head)` row keeps of its scores, and its state to save:
/// `(seq, head, kept, saves)`.
type RowResult<R> = (usize, usize, R, Vec<Vec<f32>>);

thread_local! {
    /// Each worker thread keeps its buffers across steps: no allocation in the decode loop.
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
    /// The top-k's buffers, kept the same way.
    static SELECT: std::cell::RefCell<(TopkScratch, Vec<u32>, Vec<usize>)> =
        std::cell::RefCell::new(Default::default());
}

fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|s| f(&mut s.borrow_mut()))
}

/// `a · fieldᵀ` for each page of a run, from the field's stored values; pairs of pages share
/// the loads of `a` when the group has at most four query heads and the field one row.
fn dot_pages<T: Widen + KvElem>(
    view: &VTensor,
    a: &[f32],
    m: usize,
    first: usize,
    count: usize,
    out: &mut [f32],
    e: usize,
) {
    let pages = view.shape[0];
    let block = |i: usize| view.block::<T>(i).expect("dtype checked by the caller");
    let mut t = 0;
    if view.shape[1] == 1 && m <= 4 {
        while t + 2 <= count {
            let i = first + t;
            if i + PREFETCH_PAGES + 1 < pages {
                view.prefetch(i + PREFETCH_PAGES);
                view.prefetch(i + PREFETCH_PAGES + 1);
            }
            let (b0, b1) = (block(i), block(i + 1));
            let o = &mut out[t * m..(t + 2) * m];
            match m {
                1 => put(o, dot_pair::<1, T>(a, b0, b1)),
                2 => put(o, dot_pair::<2, T>(a, b0, b1)),
                3 => put(o, dot_pair::<3, T>(a, b0, b1)),
                _ => put(o, dot_pair::<4, T>(a, b0, b1)),
            }
            t += 2;
        }
    }
    each_page(
        pages,
        first + t,
        count - t,
        |i| view.prefetch(i),
        |u, i| {
            let t = t + u;
            dot_stored(a, m, block(i), &mut out[t * e..(t + 1) * e]);
        },
    );
}

/// `body(t, first + t)` for `t` in `0..count`, `prefetch` asked first for the page
/// [`PREFETCH_PAGES`] ahead where the field has one.
#[inline(always)]
fn each_page(
    pages: usize,
    first: usize,
    count: usize,
    prefetch: impl Fn(usize),
    mut body: impl FnMut(usize, usize),
) {
    for t in 0..count {
        let i = first + t;
        if i + PREFETCH_PAGES < pages {
            prefetch(i + PREFETCH_PAGES);
        }
        body(t, i);
    }
}

/// [`fold_field_rows`] of `a` (`m` rows) for pages `first..first + count` of a one-row page
/// field stored as `T`.
fn fold_pages<T: Widen + KvElem>(
    view: &VTensor,
    fold: FieldFold,
    a: &[f32],
    m: usize,
    first: usize,
    count: usize,
    out: &mut [f32],
) {
    each_page(
        view.shape[0],
        first,
        count,
        |i| view.prefetch(i),
        |t, i| {
            let b = view.block::<T>(i).expect("dtype checked by the caller");
            let o = &mut out[t * m..(t + 1) * m];
            fold_field_rows(fold.op, fold.pair, fold.field_first, a, b, o);
        },
    );
}

/// [`envelope_rows`] of `a` (`m` rows) for pages `first..first + count` of two page fields
/// stored as `T`.
fn envelope_pages<T: Widen + KvElem>(
    hi: &VTensor,
    lo: &VTensor,
    a: &[f32],
    m: usize,
    first: usize,
    count: usize,
    out: &mut [f32],
) {
    let prefetch = |i| {
        hi.prefetch(i);
        lo.prefetch(i);
    };
    each_page(hi.shape[0], first, count, prefetch, |t, i| {
        let (h, l) = (hi.block::<T>(i), lo.block::<T>(i));
        let (h, l) = (
            h.expect("dtype checked by the caller"),
            l.expect("as above"),
        );
        envelope_rows(a, h, l, &mut out[t * m..(t + 1) * m]);
    });
}

/// Writes two pages' `R` dot products side by side.
fn put<const R: usize>(o: &mut [f32], [x, y]: [[f32; R]; 2]) {
    o[..R].copy_from_slice(&x);
    o[R..2 * R].copy_from_slice(&y);
}

/// `n` pages of a value as `[n, rows, cols]`, repeating rows or columns of size 1 (and the one
/// block of a value that is the same for every page).
fn expand(v: crate::ops::View, n: usize, rows: usize, cols: usize) -> Vec<f32> {
    if v.per_page && (v.rows, v.cols) == (rows, cols) {
        return v.data[..n * rows * cols].to_vec();
    }
    let mut data = vec![0.0; n * rows * cols];
    for (t, blk) in data.chunks_mut(rows * cols).enumerate() {
        broadcast_into(v.block(t), v.rows, v.cols, rows, cols, blk);
    }
    data
}

/// Copies a `[r, c]` block into a `[rows, cols]` block, repeating rows or columns of size 1.
fn broadcast_into(src: &[f32], r: usize, c: usize, rows: usize, cols: usize, dst: &mut [f32]) {
    for i in 0..rows {
        for j in 0..cols {
            dst[i * cols + j] = src[if r == 1 { 0 } else { i } * c + if c == 1 { 0 } else { j }];
        }
    }
}

struct CacheLeaves<'a> {
    layer: &'a LayerKv,
    pages: &'a [PageId],
    head: usize,
}

impl Leaves for CacheLeaves<'_> {
    fn page(&self, op: &Op, first: usize, count: usize, out: &mut [f32]) {
        let view = match op {
            Op::Input(Input::K) => VTensor::keys(self.layer, self.pages, self.head),
            Op::Input(Input::V) => VTensor::values(self.layer, self.pages, self.head),
            _ => unreachable!("the checker allows only K and V per page in the cache phase"),
        };
        let e = view.block_elems();
        for t in 0..count {
            view.read_block(first + t, &mut out[t * e..(t + 1) * e]);
        }
    }

    fn step(&self, _: &Op, _: &mut [f32]) {
        unreachable!("the cache phase has no step inputs")
    }

    fn dot_field(&self, _: &Op, _: &[f32], _: usize, _: usize, _: usize, _: &mut [f32]) {
        unreachable!("the cache phase reads no page fields")
    }

    fn fold_field(
        &self,
        _: &Op,
        _: FieldFold,
        _: &[f32],
        _: usize,
        _: usize,
        _: usize,
        _: &mut [f32],
    ) {
        unreachable!("the cache phase reads no page fields")
    }

    fn envelope_fields(
        &self,
        _: &Op,
        _: &Op,
        _: &[f32],
        _: usize,
        _: usize,
        _: usize,
        _: &mut [f32],
    ) {
        unreachable!("the cache phase reads no page fields")
    }
}

struct IndexLeaves<'a> {
    fields: &'a PageFields,
    pages: &'a [PageId],
    head: usize,
    heads: usize,
    q: &'a [f32],
    state: Option<&'a LayerState>,
    state_elems: &'a [usize],
}

impl Leaves for IndexLeaves<'_> {
    fn page(&self, op: &Op, first: usize, count: usize, out: &mut [f32]) {
        match *op {
            Op::Field(f) => {
                let view = VTensor::field(self.fields, f, self.pages, self.head);
                let e = view.block_elems();
                for t in 0..count {
                    // Pages sit anywhere in the pool: fetch ahead, as `dot_pages` does.
                    if first + t + PREFETCH_PAGES < self.pages.len() {
                        view.prefetch(first + t + PREFETCH_PAGES);
                    }
                    view.read_block(first + t, &mut out[t * e..(t + 1) * e]);
                }
            }
            Op::LoadState(s) => {
                let e = self.state_elems[s];
                match self.state {
                    Some(st) if e == 1 => {
                        let src = &st.fields[s][first * self.heads + self.head..];
                        for (t, o) in out[..count].iter_mut().enumerate() {
                            *o = src[t * self.heads];
                        }
                    }
                    Some(st) => {
                        for t in 0..count {
                            let at = ((first + t) * self.heads + self.head) * e;
                            out[t * e..(t + 1) * e].copy_from_slice(&st.fields[s][at..at + e]);
                        }
                    }
                    None => out[..count * e].fill(0.0),
                }
            }
            Op::Input(Input::Pos) => {
                for (t, o) in out[..count].iter_mut().enumerate() {
                    *o = (first + t) as f32;
                }
            }
            _ => unreachable!("not a per-page input of the index phase"),
        }
    }

    fn dot_field(
        &self,
        field: &Op,
        a: &[f32],
        m: usize,
        first: usize,
        count: usize,
        out: &mut [f32],
    ) {
        let &Op::Field(f) = field else {
            unreachable!("only page fields are absorbed into dots")
        };
        let view = VTensor::field(self.fields, f, self.pages, self.head);
        let e = m * view.shape[1];
        match view.storage_dtype() {
            Some(KvDtype::Bf16) => dot_pages::<half::bf16>(&view, a, m, first, count, out, e),
            Some(KvDtype::F16) => dot_pages::<half::f16>(&view, a, m, first, count, out, e),
            Some(KvDtype::Fp8) => dot_pages::<F8E4M3>(&view, a, m, first, count, out, e),
            _ => dot_pages::<f32>(&view, a, m, first, count, out, e),
        }
    }

    fn fold_field(
        &self,
        field: &Op,
        fold: FieldFold,
        a: &[f32],
        m: usize,
        first: usize,
        count: usize,
        out: &mut [f32],
    ) {
        let &Op::Field(f) = field else {
            unreachable!("only page fields are absorbed into field folds")
        };
        let view = VTensor::field(self.fields, f, self.pages, self.head);
        match view.storage_dtype() {
            Some(KvDtype::Bf16) => fold_pages::<half::bf16>(&view, fold, a, m, first, count, out),
            Some(KvDtype::F16) => fold_pages::<half::f16>(&view, fold, a, m, first, count, out),
            Some(KvDtype::Fp8) => fold_pages::<F8E4M3>(&view, fold, a, m, first, count, out),
            _ => fold_pages::<f32>(&view, fold, a, m, first, count, out),
        }
    }

    fn envelope_fields(
        &self,
        hi: &Op,
        lo: &Op,
        a: &[f32],
        m: usize,
        first: usize,
        count: usize,
        out: &mut [f32],
    ) {
        let (&Op::Field(hi), &Op::Field(lo)) = (hi, lo) else {
            unreachable!("only page fields are absorbed into envelopes")
        };
        let view = |f| VTensor::field(self.fields, f, self.pages, self.head);
        let (hi, lo) = (view(hi), view(lo));
        match (hi.storage_dtype(), lo.storage_dtype()) {
            (Some(KvDtype::Bf16), Some(KvDtype::Bf16)) => {
                envelope_pages::<half::bf16>(&hi, &lo, a, m, first, count, out)
            }
            (Some(KvDtype::F16), Some(KvDtype::F16)) => {
                envelope_pages::<half::f16>(&hi, &lo, a, m, first, count, out)
            }
            (Some(KvDtype::F32), Some(KvDtype::F32)) => {
                envelope_pages::<f32>(&hi, &lo, a, m, first, count, out)
            }
            (Some(KvDtype::Fp8), Some(KvDtype::Fp8)) => {
                envelope_pages::<F8E4M3>(&hi, &lo, a, m, first, count, out)
            }
            _ => {
                // Fields of two different dtypes: widen both to f32 first.
                let k = hi.block_elems();
                let (mut h, mut l) = (vec![0.0; k], vec![0.0; k]);
                for t in 0..count {
                    hi.read_block(first + t, &mut h);
                    lo.read_block(first + t, &mut l);
                    envelope_rows(a, &h, &l, &mut out[t * m..(t + 1) * m]);
                }
            }
        }
    }

    fn step(&self, op: &Op, out: &mut [f32]) {
        match op {
            Op::Input(Input::Q) => out.copy_from_slice(self.q),
            Op::Input(Input::NPages) => out[0] = self.pages.len() as f32,
            _ => unreachable!("not a step input of the index phase"),
        }
    }
}
