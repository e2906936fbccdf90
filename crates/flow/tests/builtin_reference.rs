//! Differential tests of the built-in flows.
//!
//! Every built-in flow is re-implemented here as plain loops over the keys read back from the
//! KV cache (no flow executor, no flow ops), and the engine's scores, per-request state and page
//! tables are compared with the reference on random inputs: ragged batches with per-sequence
//! settings, page sizes 1, 16 and 64, GQA group sizes 1, 4, 5 and 8, short sequences, budgets
//! that cover every page, overlapping sinks and recent windows, and sequences of 2000+ pages.
//!
//! Scores are compared with a relative tolerance of 1e-4 plus an absolute slack proportional to
//! the magnitude of the summed terms (the engine sums in another order). Page selections must
//! be identical, except that for float scores a page may swap with one whose reference score
//! is within that tolerance of it (a near tie). Integer-valued scores (lsh, global_local) must
//! match exactly, and so must their selections, with ties going to the lower page index.

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use vortex_flow::library::load;
use vortex_flow::runner::{FlowRunner, StepSeq, StepStats};
use vortex_flow::state::RequestState;
use vortex_flow::{Flow, Geometry, Settings};
use vortex_kv::{KvCache, KvDtype, KvGeometry, PageFields, PageId, PageTable, Sequence};

// ---------------------------------------------------------------------------------------------
// Test world: a KV cache with random contents, a flow runner and its page fields.
// ---------------------------------------------------------------------------------------------

struct World {
    name: &'static str,
    g: Geometry,
    runner: FlowRunner,
    cache: KvCache,
    fields: PageFields,
    rng: StdRng,
}

impl World {
    fn new(
        name: &'static str,
        g: Geometry,
        kv_dtype: KvDtype,
        num_pages: usize,
        seed: u64,
    ) -> Self {
        let flow = load(name, g).unwrap_or_else(|e| panic!("loading {name} for {g:?}: {e}"));
        let runner = FlowRunner::new(flow);
        let kvg = KvGeometry::new(g.heads_kv, g.head_dim, g.page_size).unwrap();
        let cache = KvCache::new(kvg, kv_dtype, 1, num_pages);
        let fields = runner.new_fields(num_pages);
        Self {
            name,
            g,
            runner,
            cache,
            fields,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    fn flow(&self) -> &Flow {
        &self.runner.flow
    }

    /// Whether the flow's scores are integers (or absent), so that selections must match the
    /// reference exactly, ties included.
    fn strict(&self) -> bool {
        matches!(self.name, "lsh" | "global_local" | "streaming" | "dense")
    }

    /// Appends `n` random tokens to `seq`; returns the pages this completed.
    fn append(&mut self, seq: &mut Sequence, n: usize) -> Vec<PageId> {
        let slots = self.cache.append(seq, n).expect("cache has room");
        let width = self.g.heads_kv * self.g.head_dim;
        let mut completed = Vec::new();
        for slot in slots {
            // A per-token scale so that pages differ in more than noise.
            let scale = self.rng.random_range(0.25f32..2.0);
            let k: Vec<f32> = (0..width)
                .map(|_| scale * self.rng.random_range(-1.0f32..1.0))
                .collect();
            let v: Vec<f32> = (0..width)
                .map(|_| self.rng.random_range(-1.0f32..1.0))
                .collect();
            self.cache
                .layer_mut(0)
                .write_token(slot.page, slot.offset, &k, &v)
                .unwrap();
            if slot.completes_page {
                completed.push(slot.page);
            }
        }
        completed
    }

    /// Sequences of the given lengths, appended in interleaved chunks so that the physical
    /// pages of different sequences interleave; then every complete page is summarised in one
    /// `summarize` call.
    fn build(&mut self, lens: &[usize]) -> Vec<Sequence> {
        let mut seqs = vec![Sequence::default(); lens.len()];
        loop {
            let mut progressed = false;
            for (b, &len) in lens.iter().enumerate() {
                let left = len - seqs[b].len;
                if left == 0 {
                    continue;
                }
                let chunk = self.rng.random_range(1..=2 * self.g.page_size).min(left);
                let mut s = std::mem::take(&mut seqs[b]);
                self.append(&mut s, chunk);
                seqs[b] = s;
                progressed = true;
            }
            if !progressed {
                break;
            }
        }
        let p = self.g.page_size;
        let pages: Vec<PageId> = seqs
            .iter()
            .flat_map(|s| s.pages[..s.complete_pages(p)].iter().copied())
            .collect();
        self.summarize(&pages);
        seqs
    }

    fn summarize(&mut self, pages: &[PageId]) {
        self.runner
            .summarize(self.cache.layer(0), &mut self.fields, pages);
    }

    /// Keys of one KV head of one page, `[page_size, head_dim]`, as stored.
    fn keys(&self, page: PageId, head: usize) -> Vec<f32> {
        let layer = self.cache.layer(0);
        let mut out = vec![0.0; self.g.page_size * self.g.head_dim];
        layer.k.read_f32(layer.head_offset(page, head), &mut out);
        out
    }

    /// A random query batch `[batch, heads_q, head_dim]`.
    fn random_q(&mut self, batch: usize) -> Vec<f32> {
        let n = batch * self.g.heads_q * self.g.head_dim;
        (0..n)
            .map(|_| self.rng.random_range(-1.0f32..1.0))
            .collect()
    }

    /// Reference summaries of one sequence's complete pages for one KV head:
    /// `[page][field] -> values`. Also checks the engine's stored fields against them.
    fn ref_summaries(&self, seq: &Sequence, head: usize) -> Vec<Vec<Vec<f32>>> {
        let p = self.g.page_size;
        let mut out = Vec::new();
        for (i, &page) in seq.pages[..seq.complete_pages(p)].iter().enumerate() {
            let keys = self.keys(page, head);
            let sums = ref_page_summary(self.name, self.flow(), &keys, self.g);
            let mut stored = Vec::new();
            for (f, want) in sums.iter().enumerate() {
                let mut got = vec![0.0; want.len()];
                self.fields.read(f, page, head, &mut got);
                // Summation order may move a value across a rounding boundary, nothing more:
                // one ulp is 2^-8 relative in bf16, 2^-3 in fp8 (2^-9 apart below 2^-6).
                let ulp = |b: f32| match self.flow().fields[f].dtype {
                    KvDtype::Fp8 => b.abs() / 8.0 + 1.0 / 512.0,
                    _ => b.abs() / 128.0 + 1e-30,
                };
                for (j, (&a, &b)) in got.iter().zip(want).enumerate() {
                    assert!(
                        (a - b).abs() <= ulp(b),
                        "{}: field '{}' of logical page {i} (physical {page}), head {head}, \
                         element {j}: engine {a}, reference {b}",
                        self.name,
                        self.flow().fields[f].name,
                    );
                }
                // An fp8 field's scores start from its stored values, checked above: an fp8 ulp
                // moves a score further than the scores' own rounding tolerance.
                let fp8 = self.flow().fields[f].dtype == KvDtype::Fp8;
                stored.push(if fp8 { got } else { want.clone() });
            }
            out.push(stored);
        }
        out
    }
}

// ---------------------------------------------------------------------------------------------
// Reference implementations.
// ---------------------------------------------------------------------------------------------

/// Mean over the page's rows in f32, summed in token order.
fn mean_rows(keys: &[f32], p: usize, d: usize) -> Vec<f32> {
    (0..d)
        .map(|c| {
            let mut s = 0f32;
            for r in 0..p {
                s += keys[r * d + c];
            }
            s / p as f32
        })
        .collect()
}

fn sign(x: f32) -> f32 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        0.0
    }
}

/// `sign(x · planes)` for a `[D]` vector and `[D, 32]` planes. Summed in f32 over `d` in order,
/// so that the sign of a value near zero is decided the same way as a straightforward matmul.
fn simhash(x: &[f32], planes: &[f32], bits: usize) -> Vec<f32> {
    (0..bits)
        .map(|j| {
            let mut s = 0f32;
            for (d, &xd) in x.iter().enumerate() {
                s += xd * planes[d * bits + j];
            }
            sign(s)
        })
        .collect()
}

fn planes(flow: &Flow) -> (&[f32], usize) {
    let c = flow
        .consts
        .iter()
        .find(|c| c.name == "planes")
        .expect("lsh declares planes");
    assert_eq!(c.rows, flow.geometry.head_dim);
    (&c.data, c.cols)
}

/// Every 8th key channel: double_sparse's default `channels`.
fn ds_channels(d: usize) -> Vec<usize> {
    (0..d / 8).map(|j| 8 * j).collect()
}

/// The summaries the flow's cache phase should store for one page and KV head, rounded to each
/// field's declared dtype; one entry per field, in the flow's field order.
fn ref_page_summary(name: &str, flow: &Flow, keys: &[f32], g: Geometry) -> Vec<Vec<f32>> {
    let (p, d) = (g.page_size, g.head_dim);
    flow.fields
        .iter()
        .map(|spec| {
            let raw: Vec<f32> = match (name, spec.name.as_str()) {
                ("block_topk" | "block_topk_fp8" | "h2o", "centroid") => mean_rows(keys, p, d),
                ("quest" | "quest_fp8", "kmax") => (0..d)
                    .map(|c| (0..p).map(|r| keys[r * d + c]).fold(f32::MIN, f32::max))
                    .collect(),
                ("quest" | "quest_fp8", "kmin") => (0..d)
                    .map(|c| (0..p).map(|r| keys[r * d + c]).fold(f32::MAX, f32::min))
                    .collect(),
                ("double_sparse", "label") => {
                    let ch = ds_channels(d);
                    (0..p)
                        .flat_map(|r| ch.iter().map(move |&c| keys[r * d + c]))
                        .collect()
                }
                ("lsh", "signature") => {
                    let (pl, bits) = planes(flow);
                    simhash(&mean_rows(keys, p, d), pl, bits)
                }
                _ => panic!("no reference for field '{}' of {name}", spec.name),
            };
            assert_eq!(
                raw.len(),
                spec.elems(),
                "{name}: field '{}' size",
                spec.name
            );
            raw.into_iter().map(|x| spec.dtype.round(x)).collect()
        })
        .collect()
}

/// A reference score with how far the engine's f32 arithmetic may stray from it.
#[derive(Debug, Clone, Copy)]
struct RefScore {
    v: f64,
    tol: f64,
}

impl RefScore {
    /// `v`, a sum whose terms have absolute values summing to `mag`.
    fn summed(v: f64, mag: f64) -> Self {
        Self {
            v,
            tol: 1e-4 * v.abs() + 1e-5 * mag + 1e-6,
        }
    }

    fn exact(v: f64) -> Self {
        Self { v, tol: 0.0 }
    }

    fn max(self, o: Self) -> Self {
        if o.v > self.v {
            Self {
                v: o.v,
                tol: o.tol.max(self.tol),
            }
        } else {
            Self {
                v: self.v,
                tol: o.tol.max(self.tol),
            }
        }
    }
}

fn dot_mag(a: impl Iterator<Item = (f32, f32)>) -> RefScore {
    let (mut v, mut mag) = (0f64, 0f64);
    for (x, y) in a {
        let t = x as f64 * y as f64;
        v += t;
        mag += t.abs();
    }
    RefScore::summed(v, mag)
}

/// Reference index-phase scores of one sequence and KV head (stateless flows).
/// `q` is the group's queries `[G, D]`; `sums` the reference summaries of the complete pages.
fn ref_scores(name: &str, flow: &Flow, q: &[f32], sums: &[Vec<Vec<f32>>]) -> Vec<RefScore> {
    let g = flow.geometry;
    let d = g.head_dim;
    let group = g.group();
    let n = sums.len();
    let qs = |h: usize| &q[h * d..(h + 1) * d];
    let neg = RefScore::exact(f64::NEG_INFINITY);
    match name {
        "block_topk" | "block_topk_fp8" => sums
            .iter()
            .map(|s| {
                (0..group).fold(neg, |best, h| {
                    best.max(dot_mag(qs(h).iter().copied().zip(s[0].iter().copied())))
                })
            })
            .collect(),
        "quest" | "quest_fp8" => sums
            .iter()
            .map(|s| {
                let (kmax, kmin) = (&s[0], &s[1]);
                (0..group).fold(neg, |best, h| {
                    let (mut v, mut mag) = (0f64, 0f64);
                    for c in 0..d {
                        let x = qs(h)[c] as f64;
                        let t = (x * kmax[c] as f64).max(x * kmin[c] as f64);
                        v += t;
                        mag += t.abs();
                    }
                    best.max(RefScore::summed(v, mag))
                })
            })
            .collect(),
        "double_sparse" => {
            let ch = ds_channels(d);
            sums.iter()
                .map(|s| {
                    let label = &s[0];
                    let mut best = neg;
                    for h in 0..group {
                        for r in 0..g.page_size {
                            let row = &label[r * ch.len()..(r + 1) * ch.len()];
                            let terms = ch.iter().zip(row).map(|(&c, &l)| (qs(h)[c], l));
                            best = best.max(dot_mag(terms));
                        }
                    }
                    best
                })
                .collect()
        }
        "lsh" => {
            let (pl, bits) = planes(flow);
            let qsig: Vec<Vec<f32>> = (0..group).map(|h| simhash(qs(h), pl, bits)).collect();
            sums.iter()
                .map(|s| {
                    let sig = &s[0];
                    let best = qsig
                        .iter()
                        .map(|qh| qh.iter().zip(sig).map(|(a, b)| a * b).sum::<f32>())
                        .fold(f32::NEG_INFINITY, f32::max);
                    RefScore::exact(best as f64)
                })
                .collect()
        }
        "global_local" => (0..n)
            .map(|i| {
                let anchor = if i % 8 == 0 { 1.0 } else { 0.0 };
                RefScore::exact(anchor * n as f64 + i as f64)
            })
            .collect(),
        _ => panic!("no stateless reference for {name}"),
    }
}

/// h2o: this step's attention estimate of every page, added to the request's running mass
/// (`mass`: `[page][kv_head]`, grown with zeros); returns the new totals, which are the scores.
fn ref_h2o(
    g: Geometry,
    q: &[f32],
    sums: &[Vec<Vec<f32>>],
    mass: &mut [f64],
    head: usize,
) -> Vec<RefScore> {
    let d = g.head_dim;
    let group = g.group();
    let n = sums.len();
    let mut attn = vec![0f64; n];
    for h in 0..group {
        let qh = &q[h * d..(h + 1) * d];
        let logits: Vec<f64> = sums
            .iter()
            .map(|s| {
                let c = &s[0];
                qh.iter()
                    .zip(c)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum::<f64>()
                    / (d as f64).sqrt()
            })
            .collect();
        let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = logits.iter().map(|l| (l - m).exp()).sum();
        for (a, l) in attn.iter_mut().zip(&logits) {
            *a += (l - m).exp() / z / group as f64;
        }
    }
    (0..n)
        .map(|i| {
            let slot = &mut mass[i * g.heads_kv + head];
            *slot += attn[i];
            RefScore {
                v: *slot,
                tol: 1e-4 * slot.abs() + 1e-7,
            }
        })
        .collect()
}

/// The budget in pages, from the documented rule: the larger of `budget` and
/// `ceil(budget_ratio * pages)`, at least 1.
fn ref_budget(s: &Settings, pages: usize) -> usize {
    let by_count = s.budget.unwrap_or(0);
    let by_ratio = s
        .budget_ratio
        .map_or(0, |r| (r * pages as f64).ceil() as usize);
    by_count.max(by_ratio).max(1)
}

fn ref_is_dense(s: &Settings, layer: usize, tokens: usize, pages: usize) -> bool {
    tokens < s.min_context || s.dense_layers.contains(&layer) || ref_budget(s, pages) >= pages
}

/// The middle range and how many of its pages a sparse step keeps.
fn ref_layout(s: &Settings, pages: usize) -> (usize, usize, usize) {
    let sinks = s.sinks.min(pages);
    let recent = s.recent.min(pages - sinks);
    let (lo, hi) = (sinks, pages - recent);
    let k = ref_budget(s, pages)
        .saturating_sub(sinks + recent)
        .min(hi - lo);
    (lo, hi, k)
}

/// Logical pages a sparse step selects: sinks, the `k` best middle pages (higher score first,
/// the lower index on ties; the last `k` without scores), the recent window.
fn ref_select(s: &Settings, pages: usize, scores: Option<&[f64]>) -> Vec<usize> {
    if ref_budget(s, pages) >= pages {
        return (0..pages).collect();
    }
    let (lo, hi, k) = ref_layout(s, pages);
    let mut mid: Vec<usize> = match scores {
        Some(sc) => {
            let mut idx: Vec<usize> = (lo..hi).collect();
            idx.sort_by(|&a, &b| sc[b].partial_cmp(&sc[a]).unwrap().then(a.cmp(&b)));
            idx.truncate(k);
            idx
        }
        None => (hi - k..hi).collect(),
    };
    mid.sort_unstable();
    (0..lo).chain(mid).chain(hi..pages).collect()
}

// ---------------------------------------------------------------------------------------------
// One decode step, engine against reference.
// ---------------------------------------------------------------------------------------------

/// What the comparisons saw, summed over steps.
#[derive(Debug, Default)]
struct Seen {
    sparse_rows: usize,
    dense_rows: usize,
    scores: usize,
    near_ties: usize,
    /// Sparse rows whose budget was smaller than sinks + recent (overlapping windows).
    overlapping: usize,
}

/// Per-request state for a stateful flow: the engine's and the reference's.
struct Requests {
    states: Vec<RequestState>,
    mass: Vec<Vec<f64>>,
}

/// Runs one step of `w`'s flow on `seqs` with `q` and checks scores, state and page table
/// against the reference.
fn check_step(
    w: &World,
    seqs: &[&Sequence],
    settings: &[Settings],
    layer: usize,
    q: &[f32],
    mut reqs: Option<&mut Requests>,
    seen: &mut Seen,
) {
    let strict = w.strict();
    let g = w.g;
    let (p, heads) = (g.page_size, g.heads_kv);
    let name = w.name;
    let has_index = w.flow().index.is_some();
    let stateful = !w.flow().states.is_empty();
    assert_eq!(
        stateful,
        reqs.is_some(),
        "{name}: pass states iff the flow has state"
    );
    assert_eq!(settings.len(), seqs.len());

    // The engine, twice: `select` (on a copy of the state) and `scores` + `table_from_scores`.
    let mut states_copy: Option<Vec<RequestState>> = reqs.as_ref().map(|r| r.states.clone());
    let mut table_select = PageTable::default();
    let stats_select = {
        let mut batch = make_batch(seqs, settings, states_copy.as_deref_mut());
        w.runner
            .select(layer, &w.fields, q, &mut batch, &mut table_select)
    };
    let mut table = PageTable::default();
    let (scores, stats) = {
        let mut batch = make_batch(
            seqs,
            settings,
            reqs.as_deref_mut().map(|r| r.states.as_mut_slice()),
        );
        let scores = w.runner.scores(layer, &w.fields, q, &mut batch);
        let stats = w
            .runner
            .table_from_scores(layer, &batch, &scores, &mut table);
        (scores, stats)
    };
    assert_eq!(
        table, table_select,
        "{name}: select and scores + table_from_scores differ"
    );
    assert_eq!(stats, stats_select, "{name}: stats of select differ");
    if let (Some(copy), Some(r)) = (&states_copy, &reqs) {
        assert_eq!(copy, &r.states, "{name}: state after select differs");
    }

    // A step where every sequence is dense shares one row per sequence among the KV heads.
    let all_dense = seqs
        .iter()
        .zip(settings)
        .all(|(seq, s)| ref_is_dense(s, layer, seq.len, seq.pages.len()));
    let rows_per_seq = if all_dense { 1 } else { heads };
    assert_eq!(
        table.rows_per_seq, rows_per_seq,
        "{name}: rows per sequence"
    );
    assert_eq!(
        table.rows(),
        seqs.len() * rows_per_seq,
        "{name}: table rows"
    );
    assert_eq!(scores.len(), seqs.len() * heads, "{name}: score rows");

    let mut want_stats = StepStats::default();
    let qstride = g.heads_q * g.head_dim;
    let group = g.group() * g.head_dim;
    for (b, (seq, s)) in seqs.iter().zip(settings).enumerate() {
        let pages = seq.pages.len();
        let n = seq.complete_pages(p);
        let dense = ref_is_dense(s, layer, seq.len, pages);
        let pos: HashMap<PageId, usize> = seq
            .pages
            .iter()
            .enumerate()
            .map(|(i, &pg)| (pg, i))
            .collect();
        assert_eq!(pos.len(), pages, "a sequence lists a page twice");
        if let Some(r) = reqs.as_deref_mut() {
            r.mass[b].resize(n * heads, 0.0);
        }
        for head in 0..heads {
            let row = table.row(b, head);
            let score_row = b * heads + head;
            let ctx = format!(
                "{name} {g:?}: seq {b} (len {}, {pages} pages), head {head}, {s:?}, layer {layer}",
                seq.len
            );
            assert_eq!(
                table.last_page_len[row] as usize,
                seq.last_page_len(p),
                "{ctx}: last_page_len"
            );
            let logical: Vec<usize> = table
                .pages(row)
                .iter()
                .map(|pg| {
                    *pos.get(pg)
                        .unwrap_or_else(|| panic!("{ctx}: page {pg} not in the sequence"))
                })
                .collect();
            if dense {
                assert!(scores[score_row].is_empty(), "{ctx}: dense row has scores");
                assert_eq!(logical, (0..pages).collect::<Vec<_>>(), "{ctx}: dense row");
                want_stats.dense_rows += 1;
                want_stats.pages_selected += pages;
                seen.dense_rows += 1;
                continue;
            }
            want_stats.sparse_rows += 1;
            want_stats.pages_selected += logical.len();
            seen.sparse_rows += 1;
            check_shape(&ctx, &logical, s, pages);
            if ref_budget(s, pages) < s.sinks.min(pages) + s.recent.min(pages - s.sinks.min(pages))
            {
                seen.overlapping += 1;
            }
            if !has_index {
                assert!(
                    scores[score_row].is_empty(),
                    "{ctx}: no index phase, yet scores"
                );
                assert_eq!(logical, ref_select(s, pages, None), "{ctx}: selection");
                continue;
            }

            // Scores of every complete page.
            let engine: &[f32] = &scores[score_row];
            assert_eq!(engine.len(), n, "{ctx}: one score per complete page");
            let sums = w.ref_summaries(seq, head);
            let qh = &q[b * qstride + head * group..][..group];
            let want = match reqs.as_deref_mut() {
                Some(r) => {
                    let want = ref_h2o(g, qh, &sums, &mut r.mass[b], head);
                    let st = &r.states[b].layers[layer].fields[0];
                    assert!(st.len() >= n * heads, "{ctx}: state too short");
                    for (i, ws) in want.iter().enumerate() {
                        let got = st[i * heads + head] as f64;
                        assert!(
                            (got - ws.v).abs() <= ws.tol,
                            "{ctx}: saved mass of page {i}: engine {got}, reference {}",
                            ws.v
                        );
                    }
                    want
                }
                None => ref_scores(name, w.flow(), qh, &sums),
            };
            for (i, (&e, ws)) in engine.iter().zip(&want).enumerate() {
                assert!(
                    (e as f64 - ws.v).abs() <= ws.tol,
                    "{ctx}: score of page {i}: engine {e}, reference {} (tolerance {})",
                    ws.v,
                    ws.tol
                );
            }
            seen.scores += n;

            // The selection follows the engine's own scores exactly (ties to the lower index)...
            let engine64: Vec<f64> = engine.iter().map(|&x| x as f64).collect();
            assert_eq!(
                logical,
                ref_select(s, pages, Some(&engine64)),
                "{ctx}: selection from the engine's own scores"
            );
            // ...and the reference scores up to near ties.
            let ref64: Vec<f64> = want.iter().map(|x| x.v).collect();
            let expect = ref_select(s, pages, Some(&ref64));
            if logical != expect {
                assert!(
                    !strict,
                    "{ctx}: selection {logical:?}, reference {expect:?}"
                );
                seen.near_ties += near_tie_swaps(&ctx, &logical, &expect, &want, s, pages);
            }
        }
    }
    assert_eq!(stats, want_stats, "{name}: step stats");
}

fn make_batch<'a>(
    seqs: &[&'a Sequence],
    settings: &'a [Settings],
    states: Option<&'a mut [RequestState]>,
) -> Vec<StepSeq<'a>> {
    let mut states: Vec<Option<&'a mut RequestState>> = match states {
        Some(st) => st.iter_mut().map(Some).collect(),
        None => seqs.iter().map(|_| None).collect(),
    };
    seqs.iter()
        .zip(settings)
        .zip(states.iter_mut())
        .map(|((&seq, settings), st)| StepSeq {
            seq,
            settings,
            state: st.take().map(|r| &mut r.layers[0]),
        })
        .collect()
}

/// Structure every sparse row has: strictly ascending, in range, sinks and recent pages
/// present, and exactly `sinks + recent + k` pages.
fn check_shape(ctx: &str, logical: &[usize], s: &Settings, pages: usize) {
    assert!(
        logical.windows(2).all(|w| w[0] < w[1]),
        "{ctx}: row not strictly ascending: {logical:?}"
    );
    assert!(
        logical.iter().all(|&i| i < pages),
        "{ctx}: page out of range"
    );
    let (lo, hi, k) = ref_layout(s, pages);
    assert_eq!(
        logical.len(),
        lo + k + (pages - hi),
        "{ctx}: row length {logical:?}"
    );
    assert_eq!(
        &logical[..lo],
        &(0..lo).collect::<Vec<_>>()[..],
        "{ctx}: sinks"
    );
    assert_eq!(
        &logical[logical.len() - (pages - hi)..],
        &(hi..pages).collect::<Vec<_>>()[..],
        "{ctx}: recent window"
    );
}

/// Accepts a middle selection that differs from the reference's only by swapping pages whose
/// reference scores are within tolerance of each other; returns the number of swapped pages.
fn near_tie_swaps(
    ctx: &str,
    got: &[usize],
    want: &[usize],
    scores: &[RefScore],
    s: &Settings,
    pages: usize,
) -> usize {
    let (lo, hi, _) = ref_layout(s, pages);
    let chosen: Vec<usize> = got
        .iter()
        .copied()
        .filter(|&i| (lo..hi).contains(&i))
        .collect();
    let worst_in = chosen
        .iter()
        .map(|&i| scores[i].v + scores[i].tol)
        .fold(f64::INFINITY, f64::min);
    let best_out = (lo..hi)
        .filter(|i| !chosen.contains(i))
        .map(|i| scores[i].v - scores[i].tol)
        .fold(f64::NEG_INFINITY, f64::max);
    assert!(
        worst_in >= best_out,
        "{ctx}: selection {got:?} is not a top-k of the reference scores (reference picks \
         {want:?}); a kept page scores {worst_in} (with tolerance) below a dropped one {best_out}"
    );
    got.iter().filter(|i| !want.contains(i)).count()
}

// ---------------------------------------------------------------------------------------------
// Cases.
// ---------------------------------------------------------------------------------------------

fn geometry(heads_q: usize, heads_kv: usize, head_dim: usize, page_size: usize) -> Geometry {
    Geometry {
        heads_q,
        heads_kv,
        head_dim,
        page_size,
    }
}

/// Settings variant `v` for a sequence of `pages` pages, starting from the flow's own.
/// Covers dense-by-budget, exact cover, one page short, random budgets, overlapping windows,
/// ratios, `min_context`, dense layers, no sinks, budget 1.
fn variant(base: &Settings, v: usize, pages: usize, tokens: usize, rng: &mut StdRng) -> Settings {
    let mut s = base.clone();
    s.budget_ratio = None;
    s.tolerance = 0.0;
    s.sinks = rng.random_range(0..=2);
    s.recent = rng.random_range(1..=3);
    let n = pages.max(1);
    match v % 12 {
        // Shorter than the budget: dense.
        0 => s.budget = Some(n + rng.random_range(1..10)),
        // The budget covers every page exactly: dense.
        1 => s.budget = Some(n),
        // One page short of dense.
        2 => s.budget = Some((n - 1).max(1)),
        // Random budgets.
        3..=5 => s.budget = Some(rng.random_range(1..=n)),
        // Sinks and recent window overlap, or exceed the budget.
        6 => {
            s.budget = Some(rng.random_range(1..=n));
            s.sinks = n / 2 + rng.random_range(0..3);
            s.recent = n / 2 + rng.random_range(1..3);
        }
        // A ratio alone, and a ratio with a smaller count (the larger applies).
        7 => {
            s.budget = None;
            s.budget_ratio = Some(rng.random_range(0.05..0.7));
        }
        8 => {
            s.budget = Some(2);
            s.budget_ratio = Some(0.3);
        }
        // Dense by context length.
        9 => {
            s.budget = Some(2);
            s.min_context = tokens + 1;
        }
        // No sinks, budget 1: only the recent window.
        10 => {
            s.budget = Some(1);
            s.sinks = 0;
        }
        // The flow's own settings.
        _ => s = base.clone(),
    }
    s
}

struct Config {
    g: Geometry,
    kv: KvDtype,
    lens: Vec<usize>,
}

/// Ragged batches over page sizes 1, 16, 64 and group sizes 1, 4, 5, 8.
fn configs() -> Vec<Config> {
    let c = |hq, hkv, d, p, kv, lens: &[usize]| Config {
        g: geometry(hq, hkv, d, p),
        kv,
        lens: lens.to_vec(),
    };
    vec![
        // Group 1, page 16.
        c(
            2,
            2,
            64,
            16,
            KvDtype::Bf16,
            &[300, 17, 1000, 5, 16, 160, 33],
        ),
        // Group 4, page 1.
        c(8, 2, 64, 1, KvDtype::Bf16, &[40, 1, 2, 100, 333, 7]),
        // Group 5, page 64.
        c(
            10,
            2,
            32,
            64,
            KvDtype::Bf16,
            &[64 * 20 + 3, 64, 63, 64 * 7, 1000, 129],
        ),
        // Group 8, page 16, head_dim 128.
        c(8, 1, 128, 16, KvDtype::Bf16, &[500, 48, 15, 260]),
        // Group 4, page 64, f32 keys (summaries still round to their bf16 fields).
        c(16, 4, 64, 64, KvDtype::F32, &[640, 65, 200, 64 * 9]),
        // Group 5, page 1, f16 keys.
        c(5, 1, 64, 1, KvDtype::F16, &[3, 90, 250, 4]),
        // Group 1, page 1.
        c(3, 3, 32, 1, KvDtype::Bf16, &[64, 2, 128]),
    ]
}

fn pool_pages(g: Geometry, lens: &[usize], extra: usize) -> usize {
    lens.iter()
        .map(|&l| l.div_ceil(g.page_size) + 2)
        .sum::<usize>()
        + extra
}

/// Every configuration, several steps each with fresh queries and a different settings
/// variant per sequence.
fn run_configs(name: &'static str) -> Seen {
    let mut seen = Seen::default();
    for (ci, cfg) in configs().into_iter().enumerate() {
        let seed = 1000 * ci as u64 + name.len() as u64;
        let mut w = World::new(name, cfg.g, cfg.kv, pool_pages(cfg.g, &cfg.lens, 0), seed);
        let seqs = w.build(&cfg.lens);
        let refs: Vec<&Sequence> = seqs.iter().collect();
        let base = w.flow().settings.clone();
        for round in 0..4 {
            let mut srng = StdRng::seed_from_u64(seed ^ (round as u64 * 7919));
            let settings: Vec<Settings> = seqs
                .iter()
                .enumerate()
                .map(|(b, s)| {
                    let mut st = variant(&base, round * 5 + b, s.pages.len(), s.len, &mut srng);
                    if round == 3 && b % 3 == 0 {
                        // The step's layer is listed as dense.
                        st.budget = Some(2);
                        st.dense_layers = vec![3];
                    }
                    st
                })
                .collect();
            let layer = if round == 3 { 3 } else { 0 };
            let q = w.random_q(seqs.len());
            check_step(&w, &refs, &settings, layer, &q, None, &mut seen);
        }
    }
    assert!(
        seen.sparse_rows > 0 && seen.dense_rows > 0,
        "{name}: {seen:?}"
    );
    seen
}

fn assert_coverage(name: &str, seen: &Seen) {
    assert!(
        seen.overlapping > 0,
        "{name}: no overlapping sinks/recent case: {seen:?}"
    );
    eprintln!("{name}: {seen:?}");
}

#[test]
fn dense_lists_every_page() {
    for cfg in configs() {
        let mut w = World::new("dense", cfg.g, cfg.kv, pool_pages(cfg.g, &cfg.lens, 0), 5);
        let seqs = w.build(&cfg.lens);
        let refs: Vec<&Sequence> = seqs.iter().collect();
        let mut base = w.flow().settings.clone();
        assert!(w.flow().index.is_none() && w.flow().cache.is_none());
        let q = w.random_q(seqs.len());
        let settings = vec![base.clone(); seqs.len()];
        let mut seen = Seen::default();
        check_step(&w, &refs, &settings, 0, &q, None, &mut seen);
        base.dense_layers = vec![0];
        let settings = vec![base; seqs.len()];
        check_step(&w, &refs, &settings, 0, &q, None, &mut seen);
        assert_eq!(seen.sparse_rows, 0, "dense flow selected sparsely");
    }
}

#[test]
fn streaming_matches_reference() {
    let seen = run_configs("streaming");
    assert_coverage("streaming", &seen);
}

#[test]
fn block_topk_matches_reference() {
    let seen = run_configs("block_topk");
    assert_coverage("block_topk", &seen);
}

#[test]
fn block_topk_fp8_matches_reference() {
    let seen = run_configs("block_topk_fp8");
    assert_coverage("block_topk_fp8", &seen);
}

#[test]
fn quest_matches_reference() {
    let seen = run_configs("quest");
    assert_coverage("quest", &seen);
}

#[test]
fn quest_fp8_matches_reference() {
    let seen = run_configs("quest_fp8");
    assert_coverage("quest_fp8", &seen);
}

#[test]
fn double_sparse_matches_reference() {
    let seen = run_configs("double_sparse");
    assert_coverage("double_sparse", &seen);
}

#[test]
fn lsh_matches_reference() {
    let seen = run_configs("lsh");
    assert_coverage("lsh", &seen);
}

#[test]
fn global_local_matches_reference() {
    let seen = run_configs("global_local");
    assert_coverage("global_local", &seen);
}

/// h2o over several decode steps: tokens are appended between steps (completing pages, whose
/// mass starts at zero), some sequences start dense and turn sparse as they grow (dense steps
/// add no mass), and the engine's saved state must track the reference's.
#[test]
fn h2o_matches_reference_over_steps() {
    let mut seen = Seen::default();
    for (ci, cfg) in configs().into_iter().enumerate() {
        let steps = 5;
        let grow = 3 * cfg.g.page_size;
        let extra = cfg.lens.len() * steps * 4;
        let mut w = World::new(
            "h2o",
            cfg.g,
            cfg.kv,
            pool_pages(cfg.g, &cfg.lens, extra),
            ci as u64,
        );
        let mut seqs = w.build(&cfg.lens);
        let base = w.flow().settings.clone();
        let mut reqs = Requests {
            states: seqs.iter().map(|_| w.runner.new_state(1)).collect(),
            mass: vec![Vec::new(); seqs.len()],
        };
        let mut srng = StdRng::seed_from_u64(77 + ci as u64);
        // Fixed settings per request across steps, as a server would keep them.
        let settings: Vec<Settings> = seqs
            .iter()
            .enumerate()
            .map(|(b, s)| {
                let mut st = variant(&base, b * 3 + 2, s.pages.len(), s.len, &mut srng);
                if b == 1 {
                    // Dense for the first two steps, sparse once it has grown by 4 pages.
                    st.budget = Some(s.pages.len() + 3);
                    st.budget_ratio = None;
                    st.min_context = 0;
                    st.dense_layers.clear();
                    st.recent = 2;
                }
                st
            })
            .collect();
        for step in 0..steps {
            let grown_dense = ref_is_dense(&settings[1], 0, seqs[1].len, seqs[1].pages.len());
            assert_eq!(grown_dense, step < 2, "sequence 1 turns sparse at step 2");
            let refs: Vec<&Sequence> = seqs.iter().collect();
            let q = w.random_q(seqs.len());
            check_step(&w, &refs, &settings, 0, &q, Some(&mut reqs), &mut seen);
            let mut completed = Vec::new();
            for (b, s) in seqs.iter_mut().enumerate() {
                let n = if b == 1 {
                    2 * cfg.g.page_size
                } else {
                    w.rng.random_range(0..=grow)
                };
                completed.extend(w.append(s, n));
            }
            w.summarize(&completed);
        }
    }
    assert!(seen.sparse_rows > 0 && seen.dense_rows > 0, "{seen:?}");
    eprintln!("h2o: {seen:?}");
}

/// Two requests sharing prefix pages through `fork` keep separate h2o state: the fork starts
/// from zero mass, and each evolves with its own queries.
#[test]
fn h2o_state_does_not_leak_between_forks() {
    for (p, lens_a) in [(1usize, 150usize), (16, 16 * 40 + 5), (64, 64 * 12 + 63)] {
        let g = geometry(8, 2, 64, p);
        let mut w = World::new("h2o", g, KvDtype::Bf16, 400, p as u64);
        let mut seqs = w.build(&[lens_a]);
        let mut a = seqs.pop().unwrap();
        let mut s = w.flow().settings.clone();
        s.budget = Some(6);
        s.sinks = 1;
        s.recent = 2;
        let mut seen = Seen::default();
        let mut ra = Requests {
            states: vec![w.runner.new_state(1)],
            mass: vec![Vec::new()],
        };
        // A alone for two steps.
        for _ in 0..2 {
            let q = w.random_q(1);
            check_step(&w, &[&a], &[s.clone()], 0, &q, Some(&mut ra), &mut seen);
        }
        // B shares every page of A; each request keeps its own state.
        let mut b = w.cache.fork(&a);
        let mut both = Requests {
            states: vec![ra.states.pop().unwrap(), w.runner.new_state(1)],
            mass: vec![ra.mass.pop().unwrap(), Vec::new()],
        };
        let settings = vec![s.clone(), s.clone()];
        for step in 0..4 {
            let q = w.random_q(2);
            check_step(&w, &[&a, &b], &settings, 0, &q, Some(&mut both), &mut seen);
            if step == 0 {
                // After one shared step, B's mass is one step's worth; A's is three.
                assert_ne!(both.states[0], both.states[1]);
            }
            // Diverge: different numbers of new tokens (copy-on-write of the shared last page).
            let mut completed = w.append(&mut a, 2 * p);
            completed.extend(w.append(&mut b, p + 1));
            w.summarize(&completed);
        }
        assert!(seen.sparse_rows > 0);
    }
}

/// Sequences of 2000+ pages, at page sizes 1 and 16, for every flow.
#[test]
fn long_sequences_match_reference() {
    let cases = [
        "block_topk",
        "quest",
        "double_sparse",
        "lsh",
        "global_local",
        "streaming",
        "dense",
        "h2o",
    ];
    for (p, lens) in [
        (1usize, vec![2500usize, 700]),
        (16, vec![16 * 2100 + 9, 16 * 300]),
    ] {
        let g = geometry(4, 1, 64, p);
        let pool = pool_pages(g, &lens, 8);
        for (i, &name) in cases.iter().enumerate() {
            let mut w = World::new(name, g, KvDtype::Bf16, pool, 31 * p as u64 + i as u64);
            let seqs = w.build(&lens);
            let refs: Vec<&Sequence> = seqs.iter().collect();
            let base = w.flow().settings.clone();
            let mut seen = Seen::default();
            let mut reqs = (!w.flow().states.is_empty()).then(|| Requests {
                states: seqs.iter().map(|_| w.runner.new_state(1)).collect(),
                mass: vec![Vec::new(); seqs.len()],
            });
            let budgets = [(Some(64), None), (Some(200), None), (None, Some(0.1))];
            for (budget, ratio) in budgets {
                let settings: Vec<Settings> = seqs
                    .iter()
                    .map(|_| {
                        let mut s = base.clone();
                        if name != "dense" {
                            s.budget = budget;
                            s.budget_ratio = ratio;
                        }
                        s
                    })
                    .collect();
                let q = w.random_q(seqs.len());
                check_step(&w, &refs, &settings, 0, &q, reqs.as_mut(), &mut seen);
            }
            if name == "dense" {
                assert_eq!(seen.sparse_rows, 0);
            } else {
                assert!(seen.sparse_rows > 0, "{name}: {seen:?}");
            }
            eprintln!("long p={p} {name}: {seen:?}");
        }
    }
}
