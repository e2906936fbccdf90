//! Causal attention for a chunk of new tokens of one sequence (prefill), over its paged KV.
//!
//! Query `t` of the chunk sits at position `start + t` and attends to keys `0..=start + t` (the
//! last `window` of them in a sliding-window layer), which must already be written to the pages. Work items are (KV head, block of queries); each item
//! streams the pages once for all `G` query heads and `QUERY_BLOCK` queries, a block of pages at
//! a time, with an online softmax per query row. With AVX-512 a block is widened to f32 and its
//! products run in register tiles (`prefill_tiles.rs`); otherwise as dot products per row.

use rayon::prelude::*;
use vortex_kv::{KvDtype, KvElem, LayerKv, PageId};

use crate::attention::AttentionError;
#[cfg(target_arch = "x86_64")]
use crate::prefill_pairs as pairs;
#[cfg(target_arch = "x86_64")]
use crate::prefill_tiles as tiles;
#[cfg(target_arch = "x86_64")]
use crate::simd::avx512::widen_into;
use crate::simd::{Level, Simd};

const QUERY_BLOCK: usize = 16;
/// Queries per item of the tiled products: each block of keys widened serves their rows. Half
/// as many where this many would leave fewer than two items a thread.
const TILED_QUERY_BLOCK: usize = 64;
/// Key pages whose scores share one online-softmax update per query row.
const PAGES_PER_UPDATE: usize = 16;
/// Keys whose scores share one softmax update in the tiled products, whatever the page size
/// (pages of 16 tokens: the same 16 pages).
const TILED_BLOCK_KEYS: usize = 256;
const _: () = assert!(TILED_BLOCK_KEYS.is_multiple_of(TILED_QUERY_BLOCK) && TILED_QUERY_BLOCK >= 2);

/// `out[t][h] = softmax(scale * K q[t][h]) V` over keys `0..=start + t`.
///
/// `q` and `out` are `[tokens, heads_q, head_dim]`; `pages` is the sequence's page table.
pub fn prefill_attention(
    layer: &LayerKv,
    pages: &[PageId],
    start: usize,
    q: &[f32],
    heads_q: usize,
    scale: f32,
    out: &mut [f32],
) -> Result<(), AttentionError> {
    prefill_attention_with(
        Simd::detect(),
        None,
        layer,
        pages,
        start,
        q,
        heads_q,
        scale,
        out,
    )
}

/// [`prefill_attention`] with the kernels of `simd`'s instruction set; with a `window`, query
/// `t` attends only to the keys `start + t + 1 - window..=start + t` (a sliding-window layer).
#[allow(clippy::too_many_arguments)]
pub fn prefill_attention_with(
    simd: Simd,
    window: Option<usize>,
    layer: &LayerKv,
    pages: &[PageId],
    start: usize,
    q: &[f32],
    heads_q: usize,
    scale: f32,
    out: &mut [f32],
) -> Result<(), AttentionError> {
    let g = layer.geometry();
    let (dim, heads_kv, page) = (g.head_dim, g.kv_heads, g.page_size);
    if heads_q == 0 || !heads_q.is_multiple_of(heads_kv) {
        return Err(AttentionError::HeadGrouping {
            heads_q,
            kv_heads: heads_kv,
        });
    }
    let width = heads_q * dim;
    if !q.len().is_multiple_of(width) || out.len() != q.len() {
        return Err(AttentionError::Shape {
            what: "query",
            expected: width,
            got: q.len(),
        });
    }
    let tokens = q.len() / width;
    if pages.len() * page < start + tokens {
        return Err(AttentionError::Shape {
            what: "pages",
            expected: (start + tokens).div_ceil(page),
            got: pages.len(),
        });
    }
    // Only the pages the chunk's keys fill are read.
    let num_pages = layer.k.len() / g.page_elems().max(1);
    let used = &pages[..(start + tokens).div_ceil(page)];
    if let Some(&p) = used.iter().find(|&&p| p as usize >= num_pages) {
        return Err(AttentionError::PageOutOfRange {
            row: 0,
            page: p,
            num_pages,
        });
    }
    if window == Some(0) {
        return Err(AttentionError::Shape {
            what: "window",
            expected: 1,
            got: 0,
        });
    }
    let chunk = Chunk {
        layer,
        pages,
        start,
        q,
        heads_q,
        scale,
        window: window.unwrap_or(usize::MAX),
    };
    match layer.dtype() {
        KvDtype::F32 => chunk.run::<f32>(simd, out),
        KvDtype::F16 => chunk.run::<half::f16>(simd, out),
        KvDtype::Bf16 => chunk.run::<half::bf16>(simd, out),
        KvDtype::Fp8 => chunk.run::<vortex_kv::F8E4M3>(simd, out),
    }
    Ok(())
}

/// A checked call: the chunk's queries and its sequence's keys.
struct Chunk<'a> {
    layer: &'a LayerKv,
    pages: &'a [PageId],
    start: usize,
    /// `[tokens, heads_q, head_dim]`.
    q: &'a [f32],
    heads_q: usize,
    scale: f32,
    /// Keys a query sees, its own included (`usize::MAX`: all before it).
    window: usize,
}

impl Chunk<'_> {
    /// The first key the query at `pos` sees.
    fn first_seen(&self, pos: usize) -> usize {
        (pos + 1).saturating_sub(self.window)
    }

    fn run<T: KvElem>(&self, simd: Simd, out: &mut [f32]) {
        let g = self.layer.geometry();
        let (dim, heads_kv, heads_q) = (g.head_dim, g.kv_heads, self.heads_q);
        let group = heads_q / heads_kv;
        let tokens = self.q.len() / (heads_q * dim);
        let tiled = cfg!(target_arch = "x86_64") && simd.level() == Level::Avx512;
        let per_item = if !tiled {
            QUERY_BLOCK
        } else if heads_kv * tokens.div_ceil(TILED_QUERY_BLOCK) >= 2 * rayon::current_num_threads()
        {
            TILED_QUERY_BLOCK
        } else {
            TILED_QUERY_BLOCK / 2
        };
        // A bf16 or fp8 pool's products on bf16 pairs, in tiles of 16 dimensions.
        #[cfg(target_arch = "x86_64")]
        let pairs = tiled
            && matches!(T::DTYPE, KvDtype::Bf16 | KvDtype::Fp8)
            && dim.is_multiple_of(tiles::TILE)
            && crate::simd::bf16_pairs();
        // Items cut at multiples of `per_item` positions from the sequence's start, not the
        // chunk's: a query's item (and so its rows' blocks and products) is then the same
        // however the prompt was cut into chunks, and its logits with it.
        let first_cut = (self.start / per_item + 1) * per_item - self.start;
        let mut cuts = vec![0];
        cuts.extend((first_cut..tokens).step_by(per_item));
        cuts.push(tokens);
        let items: Vec<(usize, usize, usize)> = (0..heads_kv)
            .flat_map(|h| cuts.windows(2).map(move |w| (h, w[0], w[1] - w[0])))
            .collect();
        let results: Vec<(usize, usize, Vec<f32>)> = items
            .into_par_iter()
            .map(|(head, t0, nq)| {
                let item = Item {
                    chunk: self,
                    t0,
                    nq,
                    head,
                    group,
                };
                let acc = match simd.level() {
                    // SAFETY: detection found the features of the pairs and of the level.
                    #[cfg(target_arch = "x86_64")]
                    Level::Avx512 if pairs => unsafe { item.attend_pairs::<T>() },
                    // SAFETY: a Simd of this level exists only if detection found its features.
                    #[cfg(target_arch = "x86_64")]
                    Level::Avx512 => unsafe { item.attend_tiles::<T>() },
                    _ => item.attend_rows::<T>(simd),
                };
                (head, t0, acc)
            })
            .collect();
        for (head, t0, acc) in results {
            for (r, row) in acc.chunks(dim).enumerate() {
                let (t, j) = (t0 + r / group, head * group + r % group);
                out[(t * heads_q + j) * dim..][..dim].copy_from_slice(row);
            }
        }
    }
}

/// One work item: the `nq` queries from `t0` of one KV head's group, `nq * group` rows.
struct Item<'a> {
    chunk: &'a Chunk<'a>,
    t0: usize,
    nq: usize,
    head: usize,
    group: usize,
}

impl Item<'_> {
    /// The item's rows of attention output, `[rows][head_dim]`, as dot products per row.
    fn attend_rows<T: KvElem>(&self, simd: Simd) -> Vec<f32> {
        let Chunk {
            layer,
            pages,
            start,
            q,
            heads_q,
            scale,
            ..
        } = *self.chunk;
        let (t0, nq, head, group) = (self.t0, self.nq, self.head, self.group);
        // Keys row r sees: `seen(r).0..seen(r).1`.
        let seen = |r: usize| {
            let pos = start + t0 + r / group;
            (self.chunk.first_seen(pos), pos + 1)
        };
        let g = layer.geometry();
        let (dim, page) = (g.head_dim, g.page_size);
        let (k, v) = (
            layer.k.as_slice::<T>().unwrap(),
            layer.v.as_slice::<T>().unwrap(),
        );
        let rows = nq * group;
        // Row r = (query t0 + r / group, head head * group + r % group): the group's heads
        // of one query are adjacent in `q`.
        let mut qb = vec![0.0f32; rows * dim];
        for t in 0..nq {
            let src = ((t0 + t) * heads_q + head * group) * dim;
            qb[t * group * dim..(t + 1) * group * dim].copy_from_slice(&q[src..src + group * dim]);
        }
        let mut m = vec![f32::NEG_INFINITY; rows];
        let mut l = vec![0.0f32; rows];
        let mut acc = vec![0.0f32; rows * dim];
        let mut s = vec![0.0f32; rows * page];
        // Scores of a block of pages side by side per row, `width` keys: one softmax update
        // per row and block instead of per row and page.
        let width = PAGES_PER_UPDATE * page;
        let mut block = vec![0.0f32; rows * width];
        let last_key = start + t0 + nq - 1;
        let last_page = last_key / page;
        let key_len = |pi: usize| page.min(last_key + 1 - pi * page);
        // The last row sees the fewest keys from the start: pages before the first row's
        // first key are seen by none.
        // Blocks of pages counted from the sequence's first page, as the items are cut.
        let first_needed = seen(0).0 / page / PAGES_PER_UPDATE * PAGES_PER_UPDATE;
        let last_from = seen(rows - 1).0;
        for b0 in (first_needed..=last_page).step_by(PAGES_PER_UPDATE) {
            let block_pages = b0..(b0 + PAGES_PER_UPDATE).min(last_page + 1);
            let mut keys = 0;
            for pi in block_pages.clone() {
                let base = layer.head_offset(pages[pi], head);
                let n = key_len(pi);
                let ahead = pages
                    .get(pi + 1)
                    .filter(|_| pi < last_page)
                    .map_or(&[][..], |&np| {
                        let b = layer.head_offset(np, head);
                        &k[b..b + page * dim]
                    });
                let scores = &mut s[..rows * n];
                simd.group_scores(&qb, &k[base..base + n * dim], dim, scale, scores, ahead);
                for (r, row) in scores.chunks_exact(n).enumerate() {
                    block[r * width + keys..][..n].copy_from_slice(row);
                }
                keys += n;
            }
            let first = b0 * page;
            for r in 0..rows {
                let row = &mut block[r * width..r * width + keys];
                // Causal mask (and the window's): the keys this row sees.
                let (from, to) = seen(r);
                let (from, to) = (
                    from.saturating_sub(first).min(keys),
                    to.saturating_sub(first).min(keys),
                );
                row[..from].fill(0.0);
                row[to..].fill(0.0);
                if from == to {
                    continue;
                }
                let new_m = m[r].max(simd.max(&row[from..to]));
                if new_m == f32::NEG_INFINITY {
                    // Every score so far is -inf: these keys weigh nothing, as in the tiles.
                    row[from..to].fill(0.0);
                    continue;
                }
                let correction = (m[r] - new_m).exp();
                l[r] = l[r] * correction + simd.exp_shifted(&mut row[from..to], new_m);
                if correction != 1.0 {
                    simd.scale(&mut acc[r * dim..(r + 1) * dim], correction);
                }
                m[r] = new_m;
            }
            let mut offset = 0;
            for pi in block_pages {
                let base = layer.head_offset(pages[pi], head);
                let n = key_len(pi);
                let probs = &mut s[..rows * n];
                for (r, row) in probs.chunks_exact_mut(n).enumerate() {
                    row.copy_from_slice(&block[r * width + offset..][..n]);
                }
                let values = &v[base..base + n * dim];
                if pi * page + n > start + t0 + 1 || pi * page < last_from {
                    // Keys some rows must not see: each row takes only those it sees, so that
                    // a weight of zero never meets a value that is not finite.
                    for (r, (p, a)) in probs
                        .chunks_exact(n)
                        .zip(acc.chunks_exact_mut(dim))
                        .enumerate()
                    {
                        let (from, to) = seen(r);
                        let from = from.saturating_sub(pi * page).min(n);
                        let to = to.saturating_sub(pi * page).min(n);
                        if from < to {
                            let vals = &values[from * dim..to * dim];
                            simd.group_accumulate(&p[from..to], vals, dim, a, &[]);
                        }
                    }
                } else {
                    simd.group_accumulate(probs, values, dim, &mut acc, &[]);
                }
                offset += n;
            }
        }
        for r in 0..rows {
            simd.scale(&mut acc[r * dim..(r + 1) * dim], 1.0 / l[r]);
        }
        acc
    }

    /// The same in AVX-512 register tiles.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, BW and VL.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    fn attend_tiles<T: KvElem>(&self) -> Vec<f32> {
        let Chunk { layer, start, .. } = *self.chunk;
        let g = layer.geometry();
        let dim = g.head_dim;
        let rows = self.nq * self.group;
        let rows_p = rows.next_multiple_of(tiles::LANES);
        let dim_p = dim.next_multiple_of(tiles::TILE);
        let (qt, visible) = self.transposed_queries(rows_p);
        let mut m = vec![f32::NEG_INFINITY; rows_p];
        let mut l = vec![0.0f32; rows_p];
        let mut corr = vec![0.0f32; rows_p];
        let mut ot = vec![0.0f32; dim_p * rows_p];
        let mut kb = vec![0.0f32; TILED_BLOCK_KEYS * dim];
        let mut vb = vec![0.0f32; TILED_BLOCK_KEYS * dim_p];
        let mut s = vec![0.0f32; TILED_BLOCK_KEYS * rows_p];
        let (first_needed, last_from) = self.window_keys();
        let last_key = start + self.t0 + self.nq - 1;
        for first in (first_needed..=last_key).step_by(TILED_BLOCK_KEYS) {
            let keys = TILED_BLOCK_KEYS.min(last_key + 1 - first);
            let width = keys.next_multiple_of(tiles::TILE);
            let (kb, vb, s) = (
                &mut kb[..width * dim],
                &mut vb[..width * dim_p],
                &mut s[..width * rows_p],
            );
            self.load_block::<T>(first, keys, kb, vb);
            tiles::scores(&qt, kb, dim, s);
            tiles::softmax(s, first, keys, &visible, &mut m, &mut l, &mut corr);
            // Keys past the first row's position, or before the last row's window, are masked
            // for some rows, whose weight of zero must not meet a value that is not finite.
            if first + keys > start + self.t0 + 1 || first < last_from {
                tiles::accumulate::<true>(s, vb, dim_p, &corr, &mut ot);
            } else {
                tiles::accumulate::<false>(s, vb, dim_p, &corr, &mut ot);
            }
        }
        normalized(&ot, &l, rows, dim)
    }

    /// The first key any row of the item sees (rounded down to a tiled block), and the first
    /// key its last row sees: keys from the one to the other are masked for some rows.
    #[cfg(target_arch = "x86_64")]
    fn window_keys(&self) -> (usize, usize) {
        let first_pos = self.chunk.start + self.t0;
        let first = self.chunk.first_seen(first_pos);
        let last_from = self.chunk.first_seen(first_pos + self.nq - 1);
        (first - first % TILED_BLOCK_KEYS, last_from)
    }

    /// Whether the tiled block of keys from `first` is seen whole by every query of the block
    /// of `TILED_BLOCK_KEYS` positions holding the item's (an item never straddles two). The
    /// pair products take such blocks, so which blocks they take for a query depends on its
    /// position alone, not on the other queries of its item.
    #[cfg(target_arch = "x86_64")]
    fn seen_whole(&self, first: usize) -> bool {
        let pos = self.chunk.start + self.t0;
        let block = pos - pos % TILED_BLOCK_KEYS;
        first + TILED_BLOCK_KEYS <= block
            && first >= self.chunk.first_seen(block + TILED_BLOCK_KEYS - 1)
    }

    /// The item's queries transposed, `[head_dim][rows_p]`, scaled once here rather than
    /// every score, and the keys each row sees. Row r is query `t0 + r / group` of head
    /// `head * group + r % group`: the group's heads of one query are adjacent in `q`. Padding
    /// rows see no key.
    #[cfg(target_arch = "x86_64")]
    fn transposed_queries(&self, rows_p: usize) -> (Vec<f32>, tiles::Visible) {
        let Chunk {
            layer,
            start,
            q,
            heads_q,
            scale,
            ..
        } = *self.chunk;
        let (dim, group) = (layer.geometry().head_dim, self.group);
        let mut qt = vec![0.0f32; dim * rows_p];
        let mut qpos = vec![-1i32; rows_p];
        let mut qfrom = vec![0i32; rows_p];
        for t in 0..self.nq {
            let src = ((self.t0 + t) * heads_q + self.head * group) * dim;
            for (j, row) in q[src..src + group * dim].chunks_exact(dim).enumerate() {
                for (d, &x) in row.iter().enumerate() {
                    qt[d * rows_p + t * group + j] = x * scale;
                }
                let pos = start + self.t0 + t;
                qpos[t * group + j] = pos as i32;
                qfrom[t * group + j] = self.chunk.first_seen(pos) as i32;
            }
        }
        let visible = tiles::Visible {
            from: qfrom,
            to: qpos,
        };
        (qt, visible)
    }

    /// [`attend_tiles`](Self::attend_tiles) over a bf16 or fp8 pool (both exact in bf16), each
    /// block [seen whole](Self::seen_whole) through the bf16 pair products
    /// (`prefill_pairs.rs`); the others take the f32 tiles, which give a masked key's weight of
    /// zero no value at all.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, BW, VL and BF16; `head_dim` must be a multiple of 16.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    fn attend_pairs<T: KvElem>(&self) -> Vec<f32> {
        let start = self.chunk.start;
        let dim = self.chunk.layer.geometry().head_dim;
        let rows = self.nq * self.group;
        let rows_p = rows.next_multiple_of(tiles::LANES);
        let (qt, visible) = self.transposed_queries(rows_p);
        let qp: Vec<u32> = (0..dim / 2)
            .flat_map(|d| {
                let (lo, hi) = (&qt[2 * d * rows_p..], &qt[(2 * d + 1) * rows_p..]);
                (0..rows_p).map(move |r| {
                    pairs::bf16_bits(lo[r]) as u32 | (pairs::bf16_bits(hi[r]) as u32) << 16
                })
            })
            .collect();
        let mut m = vec![f32::NEG_INFINITY; rows_p];
        let mut l = vec![0.0f32; rows_p];
        let mut corr = vec![0.0f32; rows_p];
        let mut ot = vec![0.0f32; dim * rows_p];
        let mut s = vec![0.0f32; TILED_BLOCK_KEYS * rows_p];
        let mut kb = vec![0.0f32; TILED_BLOCK_KEYS * dim];
        let mut vb = vec![0.0f32; TILED_BLOCK_KEYS * dim];
        let mut kp = vec![0u16; TILED_BLOCK_KEYS * dim];
        let mut vrows = vec![0u16; TILED_BLOCK_KEYS * dim];
        let mut vp = vec![0u32; TILED_BLOCK_KEYS / 2 * dim];
        let mut wp = vec![0u32; TILED_BLOCK_KEYS / 2 * rows_p];
        let (first_needed, _) = self.window_keys();
        let last_key = start + self.t0 + self.nq - 1;
        for first in (first_needed..=last_key).step_by(TILED_BLOCK_KEYS) {
            let keys = TILED_BLOCK_KEYS.min(last_key + 1 - first);
            let width = keys.next_multiple_of(tiles::TILE);
            let (s, kb, vb) = (
                &mut s[..width * rows_p],
                &mut kb[..width * dim],
                &mut vb[..width * dim],
            );
            self.load_block::<T>(first, keys, kb, vb);
            if !self.seen_whole(first) {
                tiles::scores(&qt, kb, dim, s);
                tiles::softmax(s, first, keys, &visible, &mut m, &mut l, &mut corr);
                tiles::accumulate::<true>(s, vb, dim, &corr, &mut ot);
                continue;
            }
            let (kp, vrows, vp, wp) = (
                &mut kp[..width * dim],
                &mut vrows[..width * dim],
                &mut vp[..width / 2 * dim],
                &mut wp[..width / 2 * rows_p],
            );
            // The block's values (exact in bf16), and zeros past them, two keys a pair.
            pairs::narrow_into(kp, kb);
            pairs::narrow_into(vrows, vb);
            for c in (0..width).step_by(2) {
                for d0 in (0..dim).step_by(tiles::LANES) {
                    let (a, b) = (&vrows[c * dim + d0..], &vrows[(c + 1) * dim + d0..]);
                    let out = &mut vp[c / 2 * dim + d0..][..tiles::LANES];
                    pairs::value_pairs(&a[..tiles::LANES], &b[..tiles::LANES], out);
                }
            }
            pairs::scores(&qp, kp, dim, s);
            tiles::softmax(s, first, keys, &visible, &mut m, &mut l, &mut corr);
            pairs::weight_pairs(s, rows_p, wp);
            pairs::accumulate(wp, vp, dim, &corr, &mut ot);
        }
        normalized(&ot, &l, rows, dim)
    }

    /// Keys `first..first + keys` of the item's KV head as f32: keys into `kb`
    /// (`[width][head_dim]`) and values into `vb` (`[width][dim_p]`), zeros past them. The
    /// columns of `vb` past `head_dim` are never written, so stay zero.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    fn load_block<T: KvElem>(&self, first: usize, keys: usize, kb: &mut [f32], vb: &mut [f32]) {
        let (layer, pages) = (self.chunk.layer, self.chunk.pages);
        let g = layer.geometry();
        let (dim, page) = (g.head_dim, g.page_size);
        let width = kb.len() / dim;
        let dim_p = vb.len() / width;
        let (k, v) = (
            layer.k.as_slice::<T>().unwrap(),
            layer.v.as_slice::<T>().unwrap(),
        );
        kb[keys * dim..].fill(0.0);
        vb[keys * dim_p..].fill(0.0);
        let mut c = 0;
        while c < keys {
            // The run of keys left in this page, contiguous in the pool.
            let pos = first + c;
            let n = (page - pos % page).min(keys - c);
            let base = layer.head_offset(pages[pos / page], self.head) + (pos % page) * dim;
            widen_into(&mut kb[c * dim..(c + n) * dim], &k[base..base + n * dim]);
            for i in 0..n {
                widen_into(
                    &mut vb[(c + i) * dim_p..][..dim],
                    &v[base + i * dim..][..dim],
                );
            }
            c += n;
        }
    }
}

/// The first `rows` rows of the transposed output `ot` (`[dim_p][rows_p]`), each divided by its
/// sum of weights, as `[rows][dim]`.
#[cfg(target_arch = "x86_64")]
fn normalized(ot: &[f32], l: &[f32], rows: usize, dim: usize) -> Vec<f32> {
    let rows_p = l.len();
    let mut out = vec![0.0f32; rows * dim];
    for (r, row) in out.chunks_exact_mut(dim).enumerate() {
        let inv = 1.0 / l[r];
        for (d, o) in row.iter_mut().enumerate() {
            *o = ot[d * rows_p + r] * inv;
        }
    }
    out
}
