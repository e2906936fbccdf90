//! Causal attention for a chunk of new tokens of one sequence (prefill), over its paged KV.
//!
//! Query `t` of the chunk sits at position `start + t` and attends to keys `0..=start + t`, which
//! must already be written to the pages. Work items are (KV head, block of queries); each item
//! streams the pages once for all `G` query heads and `QUERY_BLOCK` queries, with an online
//! softmax per query row.

use rayon::prelude::*;
use vortex_kv::{KvDtype, KvElem, LayerKv, PageId};

use crate::attention::AttentionError;
use crate::simd::Simd;

const QUERY_BLOCK: usize = 16;
/// Key pages whose scores share one online-softmax update per query row.
const PAGES_PER_UPDATE: usize = 16;

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
    match layer.dtype() {
        KvDtype::F32 => run::<f32>(layer, pages, start, q, heads_q, scale, out),
        KvDtype::F16 => run::<half::f16>(layer, pages, start, q, heads_q, scale, out),
        KvDtype::Bf16 => run::<half::bf16>(layer, pages, start, q, heads_q, scale, out),
        KvDtype::Fp8 => run::<vortex_kv::F8E4M3>(layer, pages, start, q, heads_q, scale, out),
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn run<T: KvElem>(
    layer: &LayerKv,
    pages: &[PageId],
    start: usize,
    q: &[f32],
    heads_q: usize,
    scale: f32,
    out: &mut [f32],
) {
    let g = layer.geometry();
    let (dim, heads_kv, page) = (g.head_dim, g.kv_heads, g.page_size);
    let group = heads_q / heads_kv;
    let tokens = q.len() / (heads_q * dim);
    let (k, v) = (
        layer.k.as_slice::<T>().unwrap(),
        layer.v.as_slice::<T>().unwrap(),
    );
    let simd = Simd::detect();
    let items: Vec<(usize, usize)> = (0..heads_kv)
        .flat_map(|h| (0..tokens).step_by(QUERY_BLOCK).map(move |t0| (h, t0)))
        .collect();
    let results: Vec<(usize, usize, Vec<f32>)> = items
        .into_par_iter()
        .map(|(head, t0)| {
            let nq = QUERY_BLOCK.min(tokens - t0);
            let rows = nq * group;
            // Row r = (query t0 + r / group, head head * group + r % group): the group's heads
            // of one query are adjacent in `q`.
            let mut qb = vec![0.0f32; rows * dim];
            for t in 0..nq {
                let src = ((t0 + t) * heads_q + head * group) * dim;
                qb[t * group * dim..(t + 1) * group * dim]
                    .copy_from_slice(&q[src..src + group * dim]);
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
            for b0 in (0..=last_page).step_by(PAGES_PER_UPDATE) {
                let block_pages = b0..(b0 + PAGES_PER_UPDATE).min(last_page + 1);
                let mut keys = 0;
                for pi in block_pages.clone() {
                    let base = layer.head_offset(pages[pi], head);
                    let n = key_len(pi);
                    let ahead =
                        pages
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
                    // Causal mask: query at `start + t` sees keys up to its own position.
                    let visible = (start + t0 + r / group + 1).saturating_sub(first).min(keys);
                    row[visible..].fill(0.0);
                    if visible == 0 {
                        continue;
                    }
                    let new_m = m[r].max(simd.max(&row[..visible]));
                    let correction = (m[r] - new_m).exp();
                    l[r] = l[r] * correction + simd.exp_shifted(&mut row[..visible], new_m);
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
                    simd.group_accumulate(probs, &v[base..base + n * dim], dim, &mut acc, &[]);
                    offset += n;
                }
            }
            for r in 0..rows {
                simd.scale(&mut acc[r * dim..(r + 1) * dim], 1.0 / l[r]);
            }
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
