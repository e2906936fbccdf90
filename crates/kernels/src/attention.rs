//! Grouped-query decode attention over a paged KV layer.
//!
//! One query token per sequence attends to the tokens of the pages its page-table row lists.
//! The query heads sharing a KV head are processed together, so every key and value row is read
//! once per step. Long rows are split into page chunks that run in parallel and are merged
//! exactly from their partial softmax states (split-K "flash decoding").

use std::cell::Cell;
use std::fmt;
use std::ops::Range;

use half::{bf16, f16};
use rayon::prelude::*;
#[cfg(target_arch = "x86_64")]
use vortex_kv::KvDtype;
use vortex_kv::{F8E4M3, KvElem, LayerKv, PageId, PageTable, Storage};

#[cfg(target_arch = "x86_64")]
use crate::decode_pairs as pairs;
#[cfg(target_arch = "x86_64")]
use crate::simd::Level;
use crate::simd::Simd;

/// Tasks a call is shared out in, per thread, so that uneven rows still balance.
const TASKS_PER_THREAD: usize = 4;
/// A row is cut into at most this many chunks, enough for a lone long row to keep many
/// threads busy.
const MAX_CHUNKS_PER_ROW: usize = 64;
/// Tokens of each KV head a chunk holds at least: its partial state (`dim + 2` floats a query
/// head) is then at most a few percent of the keys and values it reads.
const MIN_CHUNK_TOKENS: usize = 256;
/// How far ahead of use keys and values are prefetched. The hardware prefetchers alone fall
/// behind once the core is busy computing, and pages need not be adjacent in memory.
const PREFETCH_BYTES: usize = 16 << 10;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttentionError {
    /// `q` or `out` does not hold `batch * heads_q * head_dim` elements.
    Shape {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// `heads_q` is not a positive multiple of the layer's KV heads.
    HeadGrouping { heads_q: usize, kv_heads: usize },
    /// The page table's `rows_per_seq` is neither 1 nor the layer's KV heads.
    RowsPerSeq {
        rows_per_seq: usize,
        kv_heads: usize,
    },
    /// The CSR arrays of the page table contradict each other.
    MalformedTable(&'static str),
    /// A row lists no page.
    EmptyRow { row: usize },
    /// A row's last page holds no token or more tokens than a page has slots.
    LastPageLen {
        row: usize,
        len: usize,
        page_size: usize,
    },
    /// A row lists a page outside the layer's pool.
    PageOutOfRange {
        row: usize,
        page: PageId,
        num_pages: usize,
    },
    /// The layer's key and value storage differ in dtype or size.
    KvStorage,
}

impl fmt::Display for AttentionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttentionError::Shape {
                what,
                expected,
                got,
            } => write!(f, "{what}: expected {expected} elements, got {got}"),
            AttentionError::HeadGrouping { heads_q, kv_heads } => write!(
                f,
                "{heads_q} query heads are not a positive multiple of {kv_heads} KV heads"
            ),
            AttentionError::RowsPerSeq {
                rows_per_seq,
                kv_heads,
            } => write!(
                f,
                "page table has {rows_per_seq} rows per sequence; expected 1 or {kv_heads}"
            ),
            AttentionError::MalformedTable(why) => write!(f, "malformed page table: {why}"),
            AttentionError::EmptyRow { row } => write!(f, "page table row {row} lists no page"),
            AttentionError::LastPageLen {
                row,
                len,
                page_size,
            } => write!(
                f,
                "page table row {row}: last page holds {len} tokens, expected 1..={page_size}"
            ),
            AttentionError::PageOutOfRange {
                row,
                page,
                num_pages,
            } => write!(
                f,
                "page table row {row} lists page {page}, but the pool has {num_pages} pages"
            ),
            AttentionError::KvStorage => {
                write!(f, "key and value storage differ in dtype or size")
            }
        }
    }
}

impl std::error::Error for AttentionError {}

/// Decode attention for one layer: `out[s][h] = softmax(scale * K q[s][h]) V` over the tokens
/// that row `table.row(s, h / group)` lists, where `group = heads_q / kv_heads`.
///
/// `q` and `out` are `[batch, heads_q, head_dim]` with `batch = table.batch()`. The table may be
/// dense (one row per sequence) or sparse (one row per sequence and KV head); every page but the
/// last of a row contributes all its slots, the last `last_page_len` of them.
pub fn decode_attention(
    layer: &LayerKv,
    table: &PageTable,
    q: &[f32],
    heads_q: usize,
    scale: f32,
    out: &mut [f32],
) -> Result<(), AttentionError> {
    let problem = Problem::new(layer, table, heads_q)?;
    // Saturating: an absurd heads_q must fail the length check rather than overflow.
    let elems = problem
        .batch()
        .saturating_mul(heads_q)
        .saturating_mul(problem.dim);
    for (what, got) in [("query", q.len()), ("output", out.len())] {
        if got != elems {
            return Err(AttentionError::Shape {
                what,
                expected: elems,
                got,
            });
        }
    }
    match (&layer.k, &layer.v) {
        (Storage::F32(k), Storage::F32(v)) => problem.run::<f32>(k, v, q, scale, out),
        (Storage::F16(k), Storage::F16(v)) => problem.run::<f16>(k, v, q, scale, out),
        (Storage::Bf16(k), Storage::Bf16(v)) => problem.run::<bf16>(k, v, q, scale, out),
        (Storage::Fp8(k), Storage::Fp8(v)) => problem.run::<F8E4M3>(k, v, q, scale, out),
        _ => return Err(AttentionError::KvStorage),
    }
    Ok(())
}

/// How a call's two products (scores, weighted values) run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Products {
    /// f32 multiply-adds of widened keys and values, for every pool.
    Floats,
    /// `vdpbf16ps` on bf16 pairs (`decode_pairs.rs`), for a bf16 pool where
    /// [`crate::simd::bf16_pairs`] allows; the queries and weights are rounded to bf16.
    #[cfg(target_arch = "x86_64")]
    Pairs,
}

impl Products {
    fn of<T: KvElem>(simd: Simd, dim: usize) -> Self {
        #[cfg(target_arch = "x86_64")]
        if T::DTYPE == KvDtype::Bf16
            && dim.is_multiple_of(pairs::PAIR_DIMS)
            && simd.level() == Level::Avx512
            && crate::simd::bf16_pairs()
        {
            return Self::Pairs;
        }
        let _ = (simd, dim);
        Self::Floats
    }
}

/// A worker's buffers: one page's scores and the states of a whole row's chunks.
struct Scratch {
    scores: Vec<f32>,
    row_states: Vec<f32>,
}

/// A validated call: every row is non-empty and lists pages inside the pool.
struct Problem<'a> {
    table: &'a PageTable,
    kv_heads: usize,
    /// KV heads reading each row: all of them for a dense table, one for a sparse table.
    row_heads: usize,
    group: usize,
    dim: usize,
    page_size: usize,
}

/// Pages `start..end` of a row, for every KV head reading that row: the span of one partial
/// softmax state.
struct Chunk {
    row: usize,
    start: usize,
    end: usize,
}

/// What one thread takes at a time: a whole row and its output, or a chunk and its state.
enum Task<'a> {
    Row(usize, &'a mut [f32]),
    Chunk(usize, &'a mut [f32]),
}

impl<'a> Problem<'a> {
    fn new(layer: &LayerKv, table: &'a PageTable, heads_q: usize) -> Result<Self, AttentionError> {
        let geom = layer.geometry();
        let kv_heads = geom.kv_heads;
        if heads_q == 0 || !heads_q.is_multiple_of(kv_heads) {
            return Err(AttentionError::HeadGrouping { heads_q, kv_heads });
        }
        let rows_per_seq = table.rows_per_seq;
        if rows_per_seq != 1 && rows_per_seq != kv_heads {
            return Err(AttentionError::RowsPerSeq {
                rows_per_seq,
                kv_heads,
            });
        }
        let page_elems = geom.page_elems();
        if layer.k.dtype() != layer.v.dtype()
            || layer.k.len() != layer.v.len()
            || !layer.k.len().is_multiple_of(page_elems)
        {
            return Err(AttentionError::KvStorage);
        }
        let num_pages = layer.k.len() / page_elems;
        check_table(table, geom.page_size, num_pages)?;
        Ok(Self {
            table,
            kv_heads,
            row_heads: kv_heads / rows_per_seq,
            group: heads_q / kv_heads,
            dim: geom.head_dim,
            page_size: geom.page_size,
        })
    }

    fn batch(&self) -> usize {
        self.table.batch()
    }

    /// Chunks in row order, and the index of each row's first chunk. How a row is cut depends
    /// on its length alone, never on the batch or the threads, so that its output does not
    /// either (the partial softmax states merge in an order that rounds).
    fn chunks(&self) -> (Vec<Chunk>, Vec<usize>) {
        let min_pages = MIN_CHUNK_TOKENS.div_ceil(self.page_size);
        let rows = self.table.rows();
        let mut chunks = Vec::new();
        let mut starts = Vec::with_capacity(rows + 1);
        for row in 0..rows {
            starts.push(chunks.len());
            let pages = self.table.pages(row).len();
            let n = pages.div_ceil(pages.div_ceil(MAX_CHUNKS_PER_ROW).max(min_pages));
            chunks.extend((0..n).map(|c| Chunk {
                row,
                start: c * pages / n,
                end: (c + 1) * pages / n,
            }));
        }
        starts.push(chunks.len());
        (chunks, starts)
    }

    fn run<T: KvElem>(&self, keys: &[T], values: &[T], q: &[f32], scale: f32, out: &mut [f32]) {
        let simd = Simd::detect();
        let products = Products::of::<T>(simd, self.dim);
        // The queries as bf16 bits, once a call, where the products take pairs.
        let q_bits: Vec<u16> = match products {
            Products::Floats => Vec::new(),
            #[cfg(target_arch = "x86_64")]
            Products::Pairs => {
                let mut bits = vec![0; q.len()];
                // SAFETY: `Products::of` chose pairs only where detection found their features.
                unsafe { pairs::narrow_into(&mut bits, q) };
                bits
            }
        };
        let (chunks, starts) = self.chunks();
        let chunk_state = self.row_heads * self.group * (self.dim + 2);
        // Rows are numbered like the (sequence, KV head group) blocks of `q` and `out`.
        let row_elems = self.row_heads * self.group * self.dim;
        let split = self.split_rows(&starts);
        let split_chunks: usize = (0..self.table.rows())
            .filter(|&row| split[row])
            .map(|row| starts[row + 1] - starts[row])
            .sum();
        let mut states = STATES.take();
        let len = split_chunks * chunk_state;
        if states.capacity() < len {
            // Zeroed by the system as the workers first write it, not here on one thread.
            states = vec![0.0; len];
        }
        states.resize(len, 0.0);
        // Tasks, and the split rows' outputs with the range of their chunks' states.
        let mut tasks = Vec::new();
        let mut merges = Vec::new();
        let (mut rest, mut offset) = (&mut states[..], 0);
        for (row, out) in out.chunks_mut(row_elems).enumerate() {
            if !split[row] {
                tasks.push(Task::Row(row, out));
                continue;
            }
            let n = starts[row + 1] - starts[row];
            merges.push((out, offset..offset + n * chunk_state));
            offset += n * chunk_state;
            for c in starts[row]..starts[row + 1] {
                let (state, after) = rest.split_at_mut(chunk_state);
                tasks.push(Task::Chunk(c, state));
                rest = after;
            }
        }
        let attend = |c: usize, state: &mut [f32], scratch: &mut Scratch| {
            let chunk = &chunks[c];
            let rows = chunk.row * row_elems..(chunk.row + 1) * row_elems;
            let q = (&q[rows.clone()], q_bits.get(rows).unwrap_or_default());
            let next = chunks.get(c + 1);
            let kv = (keys, values);
            self.attend(simd, products, kv, q, scale, (chunk, next), state, scratch);
        };
        tasks.into_par_iter().for_each_init(
            || Scratch {
                scores: vec![0.0f32; self.group * self.page_size],
                row_states: Vec::new(),
            },
            |scratch, task| match task {
                Task::Row(row, out) => {
                    let n = starts[row + 1] - starts[row];
                    let mut row_states = std::mem::take(&mut scratch.row_states);
                    row_states.resize(n * chunk_state, 0.0);
                    let row_chunks = starts[row]..starts[row + 1];
                    for (c, state) in row_chunks.zip(row_states.chunks_exact_mut(chunk_state)) {
                        attend(c, state, scratch);
                    }
                    self.merge_row(simd, &row_states, out);
                    scratch.row_states = row_states;
                }
                Task::Chunk(c, state) => attend(c, state, scratch),
            },
        );
        merges
            .into_par_iter()
            .for_each(|(out, range)| self.merge_row(simd, &states[range], out));
        if states.capacity() * size_of::<f32>() <= MAX_KEPT_STATES {
            STATES.set(states);
        }
    }

    /// Which rows are split: a row of at most a task's share of the pages runs whole on one
    /// thread, which merges its chunks while their states are in its cache; a longer row's
    /// chunks are tasks of their own, merged once all have run. Either way each chunk's state
    /// and the merge are the same, so this choice, made from the batch and the threads, changes
    /// only the speed.
    fn split_rows(&self, starts: &[usize]) -> Vec<bool> {
        // One thread gains nothing from splitting.
        let share = match rayon::current_num_threads() {
            1 => usize::MAX,
            threads => self
                .table
                .indices
                .len()
                .div_ceil(TASKS_PER_THREAD * threads),
        };
        (0..self.table.rows())
            .map(|row| starts[row + 1] - starts[row] > 1 && self.table.pages(row).len() > share)
            .collect()
    }

    /// A row's output from the partial states of its chunks, in order.
    fn merge_row(&self, simd: Simd, states: &[f32], out: &mut [f32]) {
        let (group, dim) = (self.group, self.dim);
        let head_state = group * (dim + 2);
        let chunk_state = self.row_heads * head_state;
        for (j, out) in out.chunks_exact_mut(group * dim).enumerate() {
            let parts = states
                .chunks_exact(chunk_state)
                .map(|s| &s[j * head_state..(j + 1) * head_state]);
            merge(simd, parts, group, dim, out);
        }
    }

    /// Online softmax over the pages of one chunk, page by page; `state` holds one
    /// [`PartialState`] per KV head of the row. Its last pages fetch the first of the chunk
    /// after it, if any, meanwhile. `q` is the row's queries, and their bf16 bits where the
    /// products take pairs.
    #[allow(clippy::too_many_arguments)]
    fn attend<T: KvElem>(
        &self,
        simd: Simd,
        products: Products,
        (keys, values): (&[T], &[T]),
        (q, q_bits): (&[f32], &[u16]),
        scale: f32,
        (chunk, next): (&Chunk, Option<&Chunk>),
        state: &mut [f32],
        scratch: &mut Scratch,
    ) {
        let (group, dim) = (self.group, self.dim);
        let head_state = group * (dim + 2);
        for s in state.chunks_exact_mut(head_state) {
            let s = PartialState::new(s, group, dim);
            s.max.fill(f32::NEG_INFINITY);
            s.sum.fill(0.0);
            s.acc.fill(0.0);
        }
        let blocks = (chunk.end - chunk.start) * self.row_heads;
        let next_blocks = next.map_or(0, |n| (n.end - n.start) * self.row_heads);
        let distance = PREFETCH_BYTES.div_ceil(self.page_size * dim * size_of::<T>());
        for b in 0..blocks {
            let (j, range) = self.block(chunk, b);
            let ahead = match b + distance {
                a if a < blocks => self.block(chunk, a).1,
                a if a - blocks < next_blocks => self.block(next.unwrap(), a - blocks).1,
                _ => 0..0,
            };
            let state = PartialState::new(&mut state[j * head_state..][..head_state], group, dim);
            let heads = j * group * dim..(j + 1) * group * dim;
            let kv = (&keys[range.clone()], &values[range]);
            let ahead = (&keys[ahead.clone()], &values[ahead]);
            match products {
                Products::Floats => update(
                    simd,
                    &q[heads],
                    kv,
                    ahead,
                    scale,
                    state,
                    &mut scratch.scores,
                ),
                #[cfg(target_arch = "x86_64")]
                Products::Pairs => {
                    let q = &q_bits[heads];
                    update_pairs(simd, q, kv, ahead, scale, state, &mut scratch.scores)
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if products == Products::Pairs {
            for s in state.chunks_exact_mut(head_state) {
                // SAFETY: `Products::of` chose pairs only where detection found their features.
                unsafe { pairs::unpair(PartialState::new(s, group, dim).acc) };
            }
        }
    }

    /// Block `b` of a chunk, in visiting order (contiguous in memory for the heads of one
    /// page): the KV head `j` of the row it belongs to (`b % row_heads`) and its elements in
    /// the layer's keys and values (of page `b / row_heads` of the chunk).
    fn block(&self, chunk: &Chunk, b: usize) -> (usize, Range<usize>) {
        let pages = self.table.pages(chunk.row);
        let (i, j) = (chunk.start + b / self.row_heads, b % self.row_heads);
        let tokens = if i + 1 == pages.len() {
            self.table.last_page_len[chunk.row] as usize
        } else {
            self.page_size
        };
        let first_head = (chunk.row % self.table.rows_per_seq) * self.row_heads;
        let head_elems = self.page_size * self.dim;
        let start = (pages[i] as usize * self.kv_heads + first_head + j) * head_elems;
        (j, start..start + tokens * self.dim)
    }
}

/// The largest partial-state buffer a thread keeps between calls: with 16 threads, every split
/// row's chunks of Qwen3-8B's geometry (4 a thread, 64 chunks each) fit.
const MAX_KEPT_STATES: usize = 80 << 20;

thread_local! {
    /// The partial states of the split rows' chunks in the calling thread's last call,
    /// `[chunk][row_heads][PartialState]`, kept because a fresh buffer faulted its pages in on
    /// every call (9% of the samples of `bench attention --batch 64 --context 1k`). Every chunk
    /// sets its whole state before reading it.
    static STATES: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// Softmax state of a group of query heads over part of a row: running max, sum of
/// `exp(score - max)`, and the correspondingly weighted sum of values.
struct PartialState<'a> {
    max: &'a mut [f32],
    sum: &'a mut [f32],
    acc: &'a mut [f32],
}

impl<'a> PartialState<'a> {
    /// Splits `state` (`group * (dim + 2)` elements) into its parts.
    fn new(state: &'a mut [f32], group: usize, dim: usize) -> Self {
        let (acc, rest) = state.split_at_mut(group * dim);
        let (max, sum) = rest.split_at_mut(group);
        Self { max, sum, acc }
    }
}

/// Folds one page of keys and values (`[tokens][dim]`) of a KV head into the state of its
/// query heads `q` (`[group][dim]`), fetching the keys and values it visits next meanwhile.
fn update<T: KvElem>(
    simd: Simd,
    q: &[f32],
    (keys, values): (&[T], &[T]),
    (keys_ahead, values_ahead): (&[T], &[T]),
    scale: f32,
    state: PartialState<'_>,
    scores: &mut [f32],
) {
    let (group, dim) = (state.max.len(), state.acc.len() / state.max.len());
    let scores = &mut scores[..group * (keys.len() / dim)];
    simd.group_scores(q, keys, dim, scale, scores, keys_ahead);
    let acc = softmax_step(simd, scores, state);
    simd.group_accumulate(scores, values, dim, acc, values_ahead);
}

/// [`update`] on bf16 pairs ([`Products::Pairs`]): `q` is the query heads' bf16 bits, and the
/// state's weighted values are in pair order.
#[cfg(target_arch = "x86_64")]
fn update_pairs<T: KvElem>(
    simd: Simd,
    q: &[u16],
    (keys, values): (&[T], &[T]),
    (keys_ahead, values_ahead): (&[T], &[T]),
    scale: f32,
    state: PartialState<'_>,
    scores: &mut [f32],
) {
    let (group, dim) = (state.max.len(), state.acc.len() / state.max.len());
    let scores = &mut scores[..group * (keys.len() / dim)];
    // SAFETY: `Products::of` chose pairs only for a bf16 pool on a CPU with their features.
    unsafe {
        pairs::scores(
            q,
            bf16_bits(keys),
            dim,
            scale,
            scores,
            bf16_bits(keys_ahead),
        );
        let acc = softmax_step(simd, scores, state);
        pairs::accumulate(scores, bf16_bits(values), dim, acc, bf16_bits(values_ahead));
    }
}

/// The bits of a bf16 pool's elements.
#[cfg(target_arch = "x86_64")]
fn bf16_bits<T: KvElem>(x: &[T]) -> &[u16] {
    assert!(T::DTYPE == KvDtype::Bf16 && size_of::<T>() == size_of::<u16>());
    // SAFETY: a bf16 pool holds `half::bf16`, 16 bits of plain data (checked above).
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast(), x.len()) }
}

/// Turns one page's scores (`[group][tokens]`) into softmax weights against the state's running
/// maxima, rescaling its sums and weighted values where a maximum rose; returns the weighted
/// values, to which the page's are then added.
fn softmax_step<'s>(simd: Simd, scores: &mut [f32], state: PartialState<'s>) -> &'s mut [f32] {
    let PartialState { max, sum, acc } = state;
    let (group, dim) = (max.len(), acc.len() / max.len());
    let tokens = scores.len() / group;
    for (g, s) in scores.chunks_exact_mut(tokens).enumerate() {
        let page_max = simd.max(s);
        if page_max > max[g] {
            if sum[g] > 0.0 {
                let rescale = (max[g] - page_max).exp();
                sum[g] *= rescale;
                simd.scale(&mut acc[g * dim..(g + 1) * dim], rescale);
            }
            max[g] = page_max;
        }
        if max[g] == f32::NEG_INFINITY {
            // Every score so far is -inf: these keys weigh nothing (exp(-inf - -inf) is NaN).
            s.fill(0.0);
            continue;
        }
        sum[g] += simd.exp_shifted(s, max[g]);
    }
    acc
}

/// Combines the partial states of one KV head's query group into its normalised output.
fn merge<'s>(
    simd: Simd,
    parts: impl Iterator<Item = &'s [f32]> + Clone,
    group: usize,
    dim: usize,
    out: &mut [f32],
) {
    let parts = parts.map(|s| {
        let (acc, rest) = s.split_at(group * dim);
        let (max, sum) = rest.split_at(group);
        (acc, max, sum)
    });
    for (g, out) in out.chunks_exact_mut(dim).enumerate() {
        let max = parts
            .clone()
            .map(|(_, m, _)| m[g])
            .fold(f32::NEG_INFINITY, f32::max);
        out.fill(0.0);
        let mut total = 0.0;
        for (acc, m, s) in parts.clone() {
            let w = (m[g] - max).exp();
            total += w * s[g];
            simd.axpy(out, w, &acc[g * dim..(g + 1) * dim]);
        }
        simd.scale(out, 1.0 / total);
    }
}

fn check_table(
    table: &PageTable,
    page_size: usize,
    num_pages: usize,
) -> Result<(), AttentionError> {
    let malformed = AttentionError::MalformedTable;
    let indptr = &table.indptr;
    if indptr.first() != Some(&0) {
        return Err(malformed("indptr must start at 0"));
    }
    if *indptr.last().unwrap() as usize != table.indices.len() {
        return Err(malformed("indptr must end at the number of indices"));
    }
    if indptr.windows(2).any(|w| w[0] > w[1]) {
        return Err(malformed("indptr must not decrease"));
    }
    let rows = table.rows();
    if table.last_page_len.len() != rows {
        return Err(malformed("last_page_len must have one entry per row"));
    }
    if !rows.is_multiple_of(table.rows_per_seq) {
        return Err(malformed("rows must be a multiple of rows_per_seq"));
    }
    for row in 0..rows {
        let pages = table.pages(row);
        if pages.is_empty() {
            return Err(AttentionError::EmptyRow { row });
        }
        let len = table.last_page_len[row] as usize;
        if len == 0 || len > page_size {
            return Err(AttentionError::LastPageLen {
                row,
                len,
                page_size,
            });
        }
        if let Some(&page) = pages.iter().find(|&&p| p as usize >= num_pages) {
            return Err(AttentionError::PageOutOfRange {
                row,
                page,
                num_pages,
            });
        }
    }
    Ok(())
}
