//! Attention fidelity of a sparse step against exact attention over every token of the same KV:
//! the share of the exact attention mass on the selected pages (mass recall), the share of the
//! exact top pages that were selected (top-k recall), and the relative error of the output.

use std::collections::HashMap;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use vortex_kv::{LayerKv, PageId, PageTable, Sequence};
use vortex_model::model::{DecodeObserver, DecodeView};

/// Fidelity of one KV head of one sequence in one layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowFidelity {
    /// Exact attention mass on the selected pages, averaged over the group's query heads.
    pub mass_recall: f64,
    /// Share of the `k` pages with the most exact mass (summed over the group) that were
    /// selected, `k` being the number of pages selected.
    pub topk_recall: f64,
    /// `|out - exact| / |exact|`, averaged over the group's query heads.
    pub rel_error: f64,
}

/// Exact attention of the query heads `q` (`[group, dim]`) of KV head `head` over all tokens of
/// `seq`, compared with the pages `selected` and the output `out` (`[group, dim]`) the step used.
pub fn row_fidelity(
    kv: &LayerKv,
    seq: &Sequence,
    head: usize,
    selected: &[PageId],
    q: &[f32],
    out: &[f32],
    scale: f32,
) -> RowFidelity {
    let geom = kv.geometry();
    let (p, d) = (geom.page_size, geom.head_dim);
    let group = q.len() / d;
    let n_pages = seq.pages.len();
    let logical: HashMap<PageId, usize> = seq
        .pages
        .iter()
        .enumerate()
        .map(|(i, &pg)| (pg, i))
        .collect();
    let mut chosen = vec![false; n_pages];
    for pg in selected {
        if let Some(&i) = logical.get(pg) {
            chosen[i] = true;
        }
    }
    let tokens_of = |i: usize| {
        if i + 1 == n_pages {
            seq.last_page_len(p)
        } else {
            p
        }
    };
    // Scores of every token for every query head: [group][token].
    let mut scores = vec![Vec::with_capacity(seq.len); group];
    let mut block = vec![0.0f32; p * d];
    for (i, &page) in seq.pages.iter().enumerate() {
        kv.k.read_f32(kv.head_offset(page, head), &mut block);
        for (g, row) in scores.iter_mut().enumerate() {
            let qg = &q[g * d..(g + 1) * d];
            for t in 0..tokens_of(i) {
                let k = &block[t * d..(t + 1) * d];
                let s: f32 = qg.iter().zip(k).map(|(a, b)| a * b).sum();
                row.push(f64::from(s * scale));
            }
        }
    }
    // Softmax per head; mass per page summed over the group; exact outputs.
    let mut page_mass = vec![0.0f64; n_pages];
    let mut mass_recall = 0.0;
    let mut exact = vec![0.0f64; group * d];
    for row in scores.iter_mut() {
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row
            .iter_mut()
            .map(|s| {
                *s = (*s - max).exp();
                *s
            })
            .sum();
        row.iter_mut().for_each(|s| *s /= sum);
        let mut t0 = 0;
        for i in 0..n_pages {
            let m: f64 = row[t0..t0 + tokens_of(i)].iter().sum();
            page_mass[i] += m;
            if chosen[i] {
                mass_recall += m;
            }
            t0 += tokens_of(i);
        }
    }
    for (i, &page) in seq.pages.iter().enumerate() {
        kv.v.read_f32(kv.head_offset(page, head), &mut block);
        let t0 = i * p;
        for (g, row) in scores.iter().enumerate() {
            let acc = &mut exact[g * d..(g + 1) * d];
            for t in 0..tokens_of(i) {
                let w = row[t0 + t];
                for (a, &v) in acc.iter_mut().zip(&block[t * d..(t + 1) * d]) {
                    *a += w * f64::from(v);
                }
            }
        }
    }
    let mut rel_error = 0.0;
    for g in 0..group {
        let e = &exact[g * d..(g + 1) * d];
        let o = &out[g * d..(g + 1) * d];
        let diff: f64 = e
            .iter()
            .zip(o)
            .map(|(a, &b)| (a - f64::from(b)).powi(2))
            .sum();
        let norm: f64 = e.iter().map(|a| a * a).sum();
        rel_error += (diff / norm.max(1e-30)).sqrt();
    }
    let k = chosen.iter().filter(|&&c| c).count();
    let mut order: Vec<usize> = (0..n_pages).collect();
    order.sort_by(|&a, &b| page_mass[b].total_cmp(&page_mass[a]).then(a.cmp(&b)));
    let hits = order[..k].iter().filter(|&&i| chosen[i]).count();
    RowFidelity {
        mass_recall: mass_recall / group as f64,
        topk_recall: if k == 0 { 0.0 } else { hits as f64 / k as f64 },
        rel_error: rel_error / group as f64,
    }
}

/// Means of [`RowFidelity`] over many rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Fidelity {
    /// Rows measured: (decode step, layer, sequence, KV head).
    pub rows: usize,
    pub mass_recall: f64,
    pub topk_recall: f64,
    pub rel_error: f64,
    /// The lowest mass recall of any row.
    pub min_mass_recall: f64,
}

impl Fidelity {
    pub fn add(&mut self, r: RowFidelity) {
        let n = self.rows as f64;
        let mean = |m: f64, x: f64| (m * n + x) / (n + 1.0);
        self.mass_recall = mean(self.mass_recall, r.mass_recall);
        self.topk_recall = mean(self.topk_recall, r.topk_recall);
        self.rel_error = mean(self.rel_error, r.rel_error);
        self.min_mass_recall = if self.rows == 0 {
            r.mass_recall
        } else {
            self.min_mass_recall.min(r.mass_recall)
        };
        self.rows += 1;
    }

    pub fn merge(&mut self, o: &Fidelity) {
        if o.rows == 0 {
            return;
        }
        if self.rows == 0 {
            *self = *o;
            return;
        }
        let (a, b) = (self.rows as f64, o.rows as f64);
        let mix = |x: f64, y: f64| (x * a + y * b) / (a + b);
        self.mass_recall = mix(self.mass_recall, o.mass_recall);
        self.topk_recall = mix(self.topk_recall, o.topk_recall);
        self.rel_error = mix(self.rel_error, o.rel_error);
        self.min_mass_recall = self.min_mass_recall.min(o.min_mass_recall);
        self.rows += o.rows;
    }
}

/// Fidelity of every (sequence, KV head) row of one observed layer.
pub fn view_fidelity(v: &DecodeView<'_>) -> Vec<RowFidelity> {
    rows_fidelity(v, false)
}

/// [`view_fidelity`] of the rows that attend to some of their pages only (`sparse`), or of all.
fn rows_fidelity(v: &DecodeView<'_>, sparse: bool) -> Vec<RowFidelity> {
    let geom = v.kv.geometry();
    let (heads_kv, d) = (geom.kv_heads, geom.head_dim);
    let group = v.heads_q / heads_kv;
    let qw = v.heads_q * d;
    let rows: Vec<(usize, usize)> = (0..v.seqs.len())
        .flat_map(|s| (0..heads_kv).map(move |h| (s, h)))
        .filter(|&(s, h)| !sparse || v.table.pages(v.table.row(s, h)).len() < v.seqs[s].pages.len())
        .collect();
    rows.into_par_iter()
        .map(|(s, h)| {
            let range = s * qw + h * group * d..s * qw + (h + 1) * group * d;
            row_fidelity(
                v.kv,
                v.seqs[s],
                h,
                v.table.pages(v.table.row(s, h)),
                &v.q[range.clone()],
                &v.out[range],
                v.scale,
            )
        })
        .collect()
}

/// A [`DecodeObserver`] that measures fidelity in every `layer_stride`-th layer (of those
/// that run the flow, where it was made [`for_layers`](FidelityProbe::for_layers)).
#[derive(Debug, Clone)]
pub struct FidelityProbe {
    pub layer_stride: usize,
    /// The layers measured, where not every `layer_stride`-th.
    layers: Option<Vec<usize>>,
    pub fidelity: Fidelity,
    /// Only rows that attend to some of their pages (not short sequences or dense layers).
    pub sparse_only: bool,
}

impl FidelityProbe {
    pub fn new(layer_stride: usize) -> Self {
        Self {
            layer_stride: layer_stride.max(1),
            layers: None,
            fidelity: Fidelity::default(),
            sparse_only: false,
        }
    }

    /// Every `layer_stride`-th of `flow_layers`, the layers whose decode runs the flow (a
    /// sliding-window layer does not).
    pub fn for_layers(layer_stride: usize, flow_layers: &[usize]) -> Self {
        let mut p = Self::new(layer_stride);
        p.layers = Some(
            flow_layers
                .iter()
                .step_by(p.layer_stride)
                .copied()
                .collect(),
        );
        p
    }
}

impl DecodeObserver for FidelityProbe {
    fn wants(&self, layer: usize) -> bool {
        match &self.layers {
            Some(layers) => layers.contains(&layer),
            None => layer.is_multiple_of(self.layer_stride),
        }
    }

    fn observe(&mut self, view: DecodeView<'_>) {
        for r in rows_fidelity(&view, self.sparse_only) {
            self.fidelity.add(r);
        }
    }
}

/// The pages of `table` for every KV head of sequence `s` (for tests and reports).
pub fn selected_pages(table: &PageTable, s: usize, heads_kv: usize) -> Vec<Vec<PageId>> {
    (0..heads_kv)
        .map(|h| table.pages(table.row(s, h)).to_vec())
        .collect()
}
