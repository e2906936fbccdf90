//! top-p and min-p over many candidates without ranking them all: tokens go into buckets by
//! their log-weight, best bucket first, and only the buckets that a cut or a draw ends in are
//! sorted.

use std::cmp::Ordering;

use vortex_kernels::simd::Simd;

/// Buckets the span of log-weights is split into.
const RUNGS: usize = 4096;
/// The most nats below the best token the buckets span; the last bucket takes every token lower
/// (each weighs under e^-64 of the best).
const SPAN: f32 = 64.0;

/// A token of one bucket: id, log-weight `(logit - best) / t`, weight.
#[derive(Clone, Copy)]
struct Entry(u32, f32, f32);

/// Best first: by log-weight, then by the lower id (the ranking every cut uses).
fn rank_order(a: &Entry, b: &Entry) -> Ordering {
    super::key_order(b.1, a.1).then(a.0.cmp(&b.0))
}

/// Draws, with `u` uniform in [0, 1), from the softmax at temperature `1 / inv_t` of the
/// tokens of `logits` that top-p (`top_p < 1`) and min-p (`min_p > 0`) keep: the shortest
/// prefix of the ranking whose mass before each token is below top-p, and the tokens weighing
/// at least min-p times the best. `logits` hold no NaN or +inf and `max`, their largest, is
/// finite; -inf logits are never kept.
pub fn draw(
    simd: Simd,
    logits: &[f32],
    max: f32,
    inv_t: f32,
    top_p: f32,
    min_p: f32,
    u: f32,
) -> u32 {
    let value = |l: f32| (l - max) * inv_t;
    let mut weights: Vec<f32> = logits.iter().map(|&l| value(l)).collect();
    weights.chunks_mut(super::CHUNK).for_each(|c| {
        simd.exp_shifted(c, 0.0);
    });
    let low = logits.iter().fold(f32::INFINITY, |m, &l| {
        if l > f32::NEG_INFINITY { m.min(l) } else { m }
    });
    let span = value(low).abs().min(SPAN);
    let scale = if span > 0.0 { RUNGS as f32 / span } else { 0.0 };
    // Monotone in the log-weight; the cast saturates (-inf goes to the last bucket).
    let rung = |v: f32| ((-v * scale) as usize).min(RUNGS - 1);
    // f64 sums: the draw over a long nucleus walks tens of thousands of weights.
    let mut mass = vec![0f64; RUNGS];
    let mut lightest = vec![f32::INFINITY; RUNGS];
    // Each token's bucket, in a pass that vectorizes; -inf logits are in none.
    let rungs: Vec<u16> = logits
        .iter()
        .map(|&l| {
            if l == f32::NEG_INFINITY {
                u16::MAX
            } else {
                rung(value(l)) as u16
            }
        })
        .collect();
    let mut best = 0f32;
    let mut count = vec![0u32; RUNGS];
    for (&r, &w) in rungs.iter().zip(weights.iter()) {
        if let Some(m) = mass.get_mut(usize::from(r)) {
            *m += f64::from(w);
            count[usize::from(r)] += 1;
        }
    }
    if min_p > 0.0 {
        for (&r, &w) in rungs.iter().zip(weights.iter()) {
            if let Some(m) = lightest.get_mut(usize::from(r)) {
                *m = m.min(w);
            }
        }
        best = weights.iter().fold(0.0, |m, &w| m.max(w));
    }
    let bucket = |r: usize| -> Vec<Entry> {
        let mut run: Vec<Entry> = rungs
            .iter()
            .enumerate()
            .filter(|&(_, &b)| usize::from(b) == r)
            .map(|(i, _)| Entry(i as u32, value(logits[i]), weights[i]))
            .collect();
        run.sort_unstable_by(rank_order);
        run
    };
    // The cut: a token is kept while the mass before it is below top-p's share and it weighs
    // at least min-p's floor; whole buckets while every token of them surely is, then token by
    // token.
    let floor = if min_p > 0.0 { min_p * best } else { 0.0 };
    let limit = if top_p < 1.0 {
        f64::from(top_p) * mass.iter().sum::<f64>()
    } else {
        f64::INFINITY
    };
    let mut kept = 0f64;
    let mut last_bucket = 0;
    // The bucket the cut ends in and the tokens of it kept, best first.
    let mut edge: Option<(usize, Vec<Entry>)> = None;
    'cut: for r in 0..RUNGS {
        if count[r] == 0 {
            continue;
        }
        if kept + mass[r] < limit && lightest[r] >= floor {
            kept += mass[r];
            last_bucket = r;
            continue;
        }
        let mut run = bucket(r);
        for (j, e) in run.iter().enumerate() {
            if !(kept < limit && e.2 >= floor) {
                run.truncate(j);
                edge = Some((r, run));
                break 'cut;
            }
            kept += f64::from(e.2);
            last_bucket = r;
        }
    }
    // The draw: whole kept buckets while it lies past them, then token by token.
    let target = f64::from(u) * kept;
    let mut passed = 0f64;
    let end = edge.as_ref().map_or(RUNGS, |(r, _)| *r);
    for r in 0..end {
        if count[r] == 0 {
            continue;
        }
        if target >= passed + mass[r] {
            passed += mass[r];
            continue;
        }
        for e in bucket(r) {
            if target < passed + f64::from(e.2) {
                return e.0;
            }
            passed += f64::from(e.2);
        }
    }
    if let Some((_, run)) = &edge {
        for e in run {
            if target < passed + f64::from(e.2) {
                return e.0;
            }
            passed += f64::from(e.2);
        }
    }
    // Rounding left the draw past every kept weight: the last kept token.
    match edge {
        Some((_, run)) if !run.is_empty() => run[run.len() - 1].0,
        _ => bucket(last_bucket).last().map_or(0, |e| e.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cut's edge, with no randomness: a draw at u = 0 takes the best token, one just below
    /// 1 the last kept; -inf logits are never kept.
    #[test]
    fn draws_at_the_ends_take_the_first_and_last_kept() {
        let simd = Simd::detect();
        let slow: Vec<f32> = (0..20_000).map(|i| -0.0005 * i as f32).collect();
        let flat = vec![0.0f32; 20_000];
        let mut holes = flat.clone();
        holes
            .iter_mut()
            .step_by(2)
            .for_each(|l| *l = f32::NEG_INFINITY);
        let below_one = 1.0 - f32::EPSILON / 2.0;
        // (logits, top-p, min-p, last kept)
        for (logits, top_p, min_p, last) in [
            (&slow, 0.5, 0.0, 1386),
            (&slow, 1.0, 0.5, 1386),
            (&flat, 0.5, 0.0, 9999),
            (&flat, 1.0, 0.5, 19_999),
            (&holes, 0.5, 0.0, 9999),
        ] {
            let first = logits.iter().position(|&l| l == 0.0).unwrap() as u32;
            let at = |u| draw(simd, logits, 0.0, 1.0, top_p, min_p, u);
            assert_eq!(at(0.0), first, "top-p {top_p}, min-p {min_p}");
            assert_eq!(at(below_one), last, "top-p {top_p}, min-p {min_p}");
        }
    }
}
