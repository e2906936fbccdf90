//! The per-step workload planner of decode attention.
//!
//! Work is (sequence, KV head, page chunk). A step's page-table rows can be very uneven (one
//! request at 128K tokens beside others at 2K), so rows are cut into chunks of about equal
//! pages. The kernel runs a block per item, longest first. When the step is small enough, the
//! planner cuts it into the fewest items that still fit one round of resident blocks (nothing
//! waits for a second round); a larger step is cut into about `ROUNDS` items per resident
//! block, so that multiprocessors whose blocks run faster than others take more of the work
//! (one long item per block would make the step as slow as its slowest block). A row cut into
//! several chunks gets partial-result slots that the kernel merges.

use std::cmp::Reverse;

use cudarc::driver::{DeviceRepr, ValidAsZeroBits};

/// One block's work, laid out as the kernel's `Work` struct.
#[repr(C, align(16))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkItem {
    /// Page-table row and the KV head that reads it.
    pub row: i32,
    pub head: i32,
    /// Pages `start..end` of the row.
    pub start: i32,
    pub end: i32,
    /// Sequence whose query and output this is.
    pub seq: i32,
    /// Partial-result slot of this item (`-1` when the row is one item).
    pub part: i32,
    /// First partial slot of the row, also the index of its completion counter.
    pub first: i32,
    /// Items the row is cut into.
    pub count: i32,
}

// SAFETY: plain `repr(C)` integers, the layout the kernel declares.
unsafe impl DeviceRepr for WorkItem {}
// SAFETY: all-zero integers are a valid value.
unsafe impl ValidAsZeroBits for WorkItem {}
// The kernel's `Work` (`attention.cu`): eight 32-bit integers.
const _: () = assert!(size_of::<WorkItem>() == 32);

/// What the planner knows of the device and the kernel.
#[derive(Debug, Clone, Copy)]
pub struct PlanConfig {
    pub sms: usize,
    /// Blocks of the attention kernel resident per multiprocessor.
    pub blocks_per_sm: usize,
    /// Items per resident block to aim for; 0 lets the planner choose.
    pub waves: usize,
    /// No chunk is cut smaller than this many pages: each one costs a merge.
    pub min_chunk_pages: usize,
    /// Work units per KV head: its query heads split into this many groups, each read by its
    /// own items (1 but for groups too wide for one kernel's group).
    pub head_split: usize,
}

#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub items: Vec<WorkItem>,
    /// Partial-result slots the items use.
    pub partials: usize,
    /// Largest chunk, in pages.
    pub chunk_pages: usize,
}

/// Plans one step. `row_pages[r]` is the number of pages row `r` lists; a table has
/// `rows_per_seq` rows per sequence (1: shared by all KV heads, or `kv_heads`).
pub fn plan(row_pages: &[u32], rows_per_seq: usize, kv_heads: usize, cfg: &PlanConfig) -> Plan {
    let (units, lens) = units(row_pages, rows_per_seq, kv_heads, cfg.head_split);
    let chunk = choose_chunk(&lens, cfg);
    build(&units, &lens, chunk)
}

/// [`plan`] when it fits the step in one round of resident blocks, else `None`; where that
/// plan's chunks would be shorter than [`SHORT_CHUNK_PAGES`], the plan for one block a
/// multiprocessor instead.
pub fn one_round_plan(
    row_pages: &[u32],
    rows_per_seq: usize,
    kv_heads: usize,
    cfg: &PlanConfig,
) -> Option<Plan> {
    if cfg.waves > 0 {
        return None;
    }
    let (units, lens) = units(row_pages, rows_per_seq, kv_heads, cfg.head_split);
    let mut chunk = one_round_chunk(&lens, cfg)?;
    if cfg.blocks_per_sm > 1 && chunk < SHORT_CHUNK_PAGES {
        let one_block = PlanConfig {
            blocks_per_sm: 1,
            ..*cfg
        };
        chunk = one_round_chunk(&lens, &one_block).unwrap_or(chunk);
    }
    Some(build(&units, &lens, chunk))
}

/// The items of units of `lens` pages cut into chunks of about `chunk` pages.
fn build(units: &[(usize, usize, usize)], lens: &[usize], chunk: usize) -> Plan {
    let mut plan = Plan::default();
    for (&(seq, head, row), &n) in units.iter().zip(lens) {
        let (count, size) = split(n, chunk);
        let first = if count > 1 { plan.partials as i32 } else { -1 };
        for c in 0..count {
            plan.items.push(WorkItem {
                row: row as i32,
                head: head as i32,
                start: (c * size) as i32,
                end: ((c + 1) * size).min(n) as i32,
                seq: seq as i32,
                part: if count > 1 { first + c as i32 } else { -1 },
                first,
                count: count as i32,
            });
        }
        if count > 1 {
            plan.partials += count;
        }
        plan.chunk_pages = plan.chunk_pages.max(size);
    }
    // Longest items first, so that short ones fill the gaps at the end of the step.
    plan.items.sort_by_key(|w| Reverse(w.end - w.start));
    plan
}

/// The (sequence, unit head, page-table row) of every unit of work, and its pages. Unit head
/// `u` reads KV head `u / split`; a KV head's units are adjacent, so that they run together and
/// the second reads its pages from L2.
fn units(
    row_pages: &[u32],
    rows_per_seq: usize,
    kv_heads: usize,
    split: usize,
) -> (Vec<(usize, usize, usize)>, Vec<usize>) {
    let batch = row_pages.len() / rows_per_seq.max(1);
    let split = split.max(1);
    let units: Vec<(usize, usize, usize)> = (0..batch)
        .flat_map(|seq| (0..kv_heads * split).map(move |head| (seq, head)))
        .map(|(seq, head)| {
            let row = if rows_per_seq == 1 {
                seq
            } else {
                seq * kv_heads + head / split
            };
            (seq, head, row)
        })
        .collect();
    let lens = units.iter().map(|u| row_pages[u.2] as usize).collect();
    (units, lens)
}

/// Items a row of `n` pages is cut into at chunk size `chunk`, and their size.
fn split(n: usize, chunk: usize) -> (usize, usize) {
    let count = n.div_ceil(chunk).max(1);
    (count, n.div_ceil(count))
}

/// Items per resident block for steps too large for one round.
const ROUNDS: usize = 4;
/// One-round chunks shorter than this spend more on each item's start and merge than a
/// second resident block hides. Measured on an H100 with the one build that holds two blocks
/// (fp8 pages at head_dim 64, Qwen2.5-0.5B's step): 12- and 47-page chunks lost 8.5% and 3% to
/// one block's 24 and 96, 64-page chunks won 3% over 128. Between, the batch matters too: at
/// 59-61 pages one block won by 1-4% with 4 and 6 sequences and lost by 1.5-4% with 12; at
/// 56-60 pages with 5 and 8 sequences the two tied.
pub const SHORT_CHUNK_PAGES: usize = 56;
/// The largest item, in pages, that a one-round plan may use: longer ones leave the step
/// waiting on the slowest block (measured on an H200: 683-page items in one round beat
/// several rounds, 2731-page items lose to 4 rounds of 631).
const ROUND_ITEM_MAX: usize = 1024;

fn choose_chunk(lens: &[usize], cfg: &PlanConfig) -> usize {
    let slots = (cfg.sms * cfg.blocks_per_sm).max(1);
    let total: usize = lens.iter().sum();
    let floor = cfg.min_chunk_pages.max(1);
    if cfg.waves > 0 {
        return total.div_ceil(slots * cfg.waves).max(floor);
    }
    one_round_chunk(lens, cfg).unwrap_or_else(|| total.div_ceil(slots * ROUNDS).max(floor))
}

/// The smallest chunk whose items fit one round of resident blocks, if that chunk is no
/// larger than [`ROUND_ITEM_MAX`].
fn one_round_chunk(lens: &[usize], cfg: &PlanConfig) -> Option<usize> {
    let slots = (cfg.sms * cfg.blocks_per_sm).max(1);
    let floor = cfg.min_chunk_pages.max(1);
    let items = |chunk: usize| -> usize { lens.iter().map(|&n| n.div_ceil(chunk).max(1)).sum() };
    // Items only fall as chunks grow: a binary search.
    let (mut lo, mut hi) = (floor, lens.iter().copied().max().unwrap_or(1).max(floor));
    if items(hi) > slots {
        return None;
    }
    while lo < hi {
        let mid = (lo + hi) / 2;
        if items(mid) <= slots {
            hi = mid
        } else {
            lo = mid + 1
        }
    }
    (lo <= ROUND_ITEM_MAX).then_some(lo)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> PlanConfig {
        PlanConfig {
            sms: 132,
            blocks_per_sm: 2,
            waves: 1,
            min_chunk_pages: 8,
            head_split: 1,
        }
    }

    /// Every page of every (row, head) is covered exactly once, and slots are consistent.
    fn check(row_pages: &[u32], rows_per_seq: usize, kv_heads: usize, p: &Plan) {
        let batch = row_pages.len() / rows_per_seq;
        let mut seen = std::collections::HashMap::new();
        let mut slots = vec![0usize; p.partials];
        for w in &p.items {
            assert!(w.start < w.end, "{w:?}");
            let row = if rows_per_seq == 1 {
                w.seq as usize
            } else {
                w.seq as usize * kv_heads + w.head as usize
            };
            assert_eq!(w.row as usize, row);
            let e = seen
                .entry((w.seq, w.head))
                .or_insert(vec![0u8; row_pages[row] as usize]);
            for pg in w.start..w.end {
                e[pg as usize] += 1;
            }
            if w.count > 1 {
                assert!(w.part >= w.first && w.part < w.first + w.count);
                slots[w.part as usize] += 1;
            } else {
                assert_eq!(w.part, -1);
            }
        }
        assert_eq!(seen.len(), batch * kv_heads);
        for v in seen.values() {
            assert!(v.iter().all(|&c| c == 1));
        }
        assert!(slots.iter().all(|&c| c == 1));
    }

    #[test]
    fn dense_uniform_rows_fill_the_device() {
        let rows = vec![2048u32; 16];
        let p = plan(&rows, 1, 8, &cfg());
        check(&rows, 1, 8, &p);
        assert!(
            p.items.len() >= 264 && p.items.len() <= 2 * 264,
            "{}",
            p.items.len()
        );
    }

    #[test]
    fn ragged_rows_get_chunks_in_proportion() {
        let rows = vec![8192u32, 16, 1, 300, 4096, 2];
        let p = plan(&rows, 1, 4, &cfg());
        check(&rows, 1, 4, &p);
        let longest = p.items.iter().filter(|w| w.seq == 0).count();
        let short = p.items.iter().filter(|w| w.seq == 2).count();
        assert!(longest > 4 * 8, "{longest}");
        assert_eq!(short, 4);
        // No chunk is more than one page over the planned size.
        assert!(
            p.items
                .iter()
                .all(|w| (w.end - w.start) as usize <= p.chunk_pages)
        );
    }

    #[test]
    fn one_round_when_it_fits_else_several() {
        let cfg = PlanConfig {
            sms: 132,
            blocks_per_sm: 3,
            waves: 0,
            min_chunk_pages: 8,
            head_split: 1,
        };
        // 128 rows of 512 pages on 396 slots: three items a row, one round.
        let rows = vec![512u32; 16];
        let p = plan(&rows, 1, 8, &cfg);
        check(&rows, 1, 8, &p);
        assert_eq!(p.items.len(), 384);
        // 128 rows of 8192 pages: one round would need 2731-page items; four per slot instead.
        let rows = vec![8192u32; 16];
        let p = plan(&rows, 1, 8, &cfg);
        check(&rows, 1, 8, &p);
        assert!(p.items.len() >= 4 * 396 - 128, "{}", p.items.len());
        let ragged: Vec<u32> = (0..16).map(|i| 8 + i * 40).collect();
        let p = plan(&ragged, 1, 8, &cfg);
        check(&ragged, 1, 8, &p);
        assert!(
            p.items.len() <= 396 && p.items.len() > 300,
            "{}",
            p.items.len()
        );
    }

    /// A KV head's query heads split over `head_split` items: each unit head reads its KV
    /// head's row, and a KV head's units are adjacent.
    #[test]
    fn split_heads_read_their_kv_heads_rows() {
        let split_cfg = PlanConfig {
            head_split: 2,
            ..cfg()
        };
        let rows: Vec<u32> = (0..3 * 4).map(|i| 1 + (i * 37 % 90) as u32).collect();
        let p = plan(&rows, 4, 4, &split_cfg);
        let mut pages = std::collections::BTreeMap::new();
        for w in &p.items {
            assert_eq!(w.row, w.seq * 4 + w.head / 2, "{w:?}");
            *pages.entry((w.seq, w.head)).or_insert(0) += w.end - w.start;
        }
        assert_eq!(pages.len(), 3 * 8);
        for ((seq, head), n) in pages {
            assert_eq!(n as u32, rows[(seq * 4 + head / 2) as usize]);
        }
        let shared = plan(&rows[..3], 1, 4, &split_cfg);
        assert!(shared.items.iter().all(|w| w.row == w.seq));
        let heads: std::collections::BTreeSet<_> =
            shared.items.iter().map(|w| (w.seq, w.head)).collect();
        assert_eq!(heads.len(), 3 * 8);
    }

    #[test]
    fn sparse_rows_per_head() {
        let rows: Vec<u32> = (0..3 * 8).map(|i| 1 + (i * 37 % 200) as u32).collect();
        let p = plan(&rows, 8, 8, &cfg());
        check(&rows, 8, 8, &p);
    }

    /// The shapes measured: Qwen2.5-0.5B's two KV heads on an H100 whose one-round build
    /// holds two blocks a multiprocessor. Few rows plan for one block; 16 rows at 8K keep two.
    #[test]
    fn short_one_round_chunks_plan_for_one_block() {
        let cfg = PlanConfig {
            sms: 132,
            blocks_per_sm: 2,
            waves: 0,
            min_chunk_pages: 16,
            head_split: 1,
        };
        let items = |batch: usize, pages: u32| {
            let p = one_round_plan(&vec![pages; batch], 1, 2, &cfg).unwrap();
            (p.items.len(), p.chunk_pages)
        };
        // 24K: two rows of 1536 pages, and eight.
        assert_eq!(items(1, 1536), (2 * 64, 24));
        assert_eq!(items(4, 1536), (8 * 16, 96));
        // 8K, batch 16: 32 rows of 512 pages in 64-page chunks, two blocks a multiprocessor.
        assert_eq!(items(16, 512), (32 * 8, 64));
    }

    /// `one_round_plan` is the plan where building it shows no more items than resident
    /// blocks, none longer than `ROUND_ITEM_MAX` pages.
    #[test]
    fn one_round_agrees_with_the_plan() {
        for blocks_per_sm in [1, 2, 3] {
            let cfg = PlanConfig {
                sms: 132,
                blocks_per_sm,
                waves: 0,
                min_chunk_pages: 8,
                head_split: 1,
            };
            for batch in [1, 3, 16, 17, 64] {
                for pages in [1u32, 9, 128, 512, 1100, 2048, 8192] {
                    for rows_per_seq in [1, 8] {
                        let rows: Vec<u32> = (0..batch * rows_per_seq)
                            .map(|i| pages + (i as u32 % 5))
                            .collect();
                        let p = plan(&rows, rows_per_seq, 8, &cfg);
                        let fits =
                            p.items.len() <= 132 * blocks_per_sm && p.chunk_pages <= ROUND_ITEM_MAX;
                        let what = format!("{blocks_per_sm} {batch} {pages} {rows_per_seq}");
                        let once = one_round_plan(&rows, rows_per_seq, 8, &cfg);
                        assert_eq!(once.is_some(), fits, "{what}");
                        // The plan itself, or where its chunks are short and blocks share a
                        // multiprocessor, the plan for one block each.
                        let one_block = PlanConfig {
                            blocks_per_sm: 1,
                            ..cfg
                        };
                        let (_, lens) = units(&rows, rows_per_seq, 8, 1);
                        let short =
                            one_round_chunk(&lens, &cfg).is_some_and(|c| c < SHORT_CHUNK_PAGES);
                        let want = if blocks_per_sm > 1 && short {
                            Some(plan(&rows, rows_per_seq, 8, &one_block))
                                .filter(|q| q.items.len() <= 132 && q.chunk_pages <= ROUND_ITEM_MAX)
                                .unwrap_or(p)
                        } else {
                            p
                        };
                        assert!(once.is_none_or(|o| o.items == want.items), "{what}");
                    }
                }
            }
        }
    }
}
