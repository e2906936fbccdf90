//! From per-page scores to a sparse page table: sinks and recent pages always, the top-scoring
//! pages in between, in sequence order.

use vortex_kernels::topk::{TopkScratch, topk_approx_with, topk_exact_with};

use crate::Settings;

/// Logical pages (0-based positions in the sequence) one KV head attends to this step.
///
/// `scores[i]` scores logical page `i` for the pages that have one (complete pages); `None` means
/// the flow has no index phase, so pages rank by recency.
pub fn select_pages(
    settings: &Settings,
    pages: usize,
    scores: Option<&[f32]>,
    approx: bool,
    scratch: &mut TopkScratch,
    picked: &mut Vec<u32>,
    out: &mut Vec<usize>,
) {
    out.clear();
    let budget = settings.budget_pages(pages);
    if budget >= pages {
        out.extend(0..pages);
        return;
    }
    let sinks = settings.sinks.min(pages);
    // The last page holds the token being decoded: it is always kept.
    let recent = settings.recent.max(1).min(pages - sinks);
    let middle = sinks..pages - recent;
    let k = budget.saturating_sub(sinks + recent).min(middle.len());
    out.extend(0..sinks);
    match scores {
        Some(scores) if k > 0 => {
            let candidates = &scores[middle.clone()];
            if approx && settings.tolerance > 0.0 {
                topk_approx_with(scratch, candidates, k, settings.tolerance_f32(), picked);
            } else {
                topk_exact_with(scratch, candidates, k, picked);
            }
            out.extend(picked.iter().map(|&i| middle.start + i as usize));
        }
        _ => out.extend(middle.end - k..middle.end),
    }
    out.extend(pages - recent..pages);
}
