//! Choosing the next token from logits: penalties, temperature, top-k, top-p, min-p, seeded.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::sync::OnceLock;

use vortex_kernels::simd::Simd;

use crate::grammar::Constraint;

mod device;
mod ladder;

/// How to pick tokens. The defaults are greedy decoding.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 picks the most likely token.
    pub temperature: f32,
    /// Keep the k most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches p (1: all).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (0: none).
    pub min_p: f32,
    /// Divides positive logits (multiplies negative ones) of tokens seen before (1: off).
    pub repetition_penalty: f32,
    /// Subtracts `frequency_penalty * count` from the logits of generated tokens.
    pub frequency_penalty: f32,
    /// Subtracts `presence_penalty` from the logits of tokens generated at least once.
    pub presence_penalty: f32,
    /// Added to the logits of these tokens after the penalties (OpenAI's `logit_bias`).
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: 0,
        }
    }
}

/// A token for a device to choose where the logits are: at temperature 0 the argmax, else a
/// draw from the softmax at `temperature` over the tokens the cuts keep (as
/// [`SamplingParams`] defines them: the `top_k` best, of those the shortest prefix of the
/// ranking whose probability reaches `top_p`, and those at least `min_p` times as likely as the
/// best), its noise derived from `seed` (the same draw for the same seed and logits).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceDraw {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub seed: u64,
}

impl DeviceDraw {
    /// The most likely token (the lowest id among equals).
    pub const ARGMAX: Self = Self::plain(0.0, 0);

    /// A draw from the whole softmax at `temperature`.
    pub const fn plain(temperature: f32, seed: u64) -> Self {
        Self {
            temperature,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed,
        }
    }
}

/// A sampling parameter out of its range: which one, and what it must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidParam {
    pub field: &'static str,
    pub rule: &'static str,
}

impl std::fmt::Display for InvalidParam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} must be {}", self.field, self.rule)
    }
}

impl From<InvalidParam> for String {
    fn from(e: InvalidParam) -> String {
        e.to_string()
    }
}

impl SamplingParams {
    pub fn validate(&self) -> Result<(), InvalidParam> {
        let check = |ok: bool, field, rule| {
            if ok {
                Ok(())
            } else {
                Err(InvalidParam { field, rule })
            }
        };
        check(
            self.temperature.is_finite() && self.temperature >= 0.0,
            "temperature",
            "a finite number >= 0",
        )?;
        check(self.top_p > 0.0 && self.top_p <= 1.0, "top_p", "in (0, 1]")?;
        check((0.0..=1.0).contains(&self.min_p), "min_p", "in [0, 1]")?;
        check(
            self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0,
            "repetition_penalty",
            "a finite number > 0",
        )?;
        check(
            (-2.0..=2.0).contains(&self.frequency_penalty),
            "frequency_penalty",
            "in [-2, 2]",
        )?;
        check(
            (-2.0..=2.0).contains(&self.presence_penalty),
            "presence_penalty",
            "in [-2, 2]",
        )?;
        check(
            self.logit_bias
                .iter()
                .all(|&(_, b)| (-100.0..=100.0).contains(&b)),
            "logit_bias",
            "in [-100, 100]",
        )
    }
}

/// A sampler for one sequence: its parameters, its random stream and what it has produced.
#[derive(Debug, Clone)]
pub struct Sampler {
    pub params: SamplingParams,
    rng: u64,
    generated: HashMap<u32, u32>,
    /// Tokens produced so far.
    draws: u64,
    /// The distinct prompt and generated tokens in ascending order, for the repetition penalty
    /// (a pass in id order over the logits).
    seen: Vec<u32>,
    /// Tokens never drawn while fewer than `banned_until` have been (see
    /// [`with_min_tokens`](Self::with_min_tokens)).
    banned: Vec<u32>,
    banned_until: u64,
    /// The grammar the tokens must follow, if any (see [`constrained`](Self::constrained)).
    constraint: Option<Constraint>,
    /// A token its grammar did not allow was recorded (its mask allowed nothing).
    off_grammar: bool,
}

impl Sampler {
    pub fn new(params: SamplingParams, prompt: &[u32]) -> Self {
        // Every seed gives a non-zero xorshift state (one that is zero stays zero).
        let rng = splitmix(params.seed) | 1;
        Self {
            params,
            rng,
            draws: 0,
            generated: HashMap::new(),
            seen: {
                let mut seen = prompt.to_vec();
                seen.sort_unstable();
                seen.dedup();
                seen
            },
            banned: Vec::new(),
            banned_until: 0,
            constraint: None,
            off_grammar: false,
        }
    }

    /// Draws only tokens `constraint` allows, end tokens only where its grammar is complete
    /// (there `min_tokens` gives way). A device then draws only under the grammar's mask
    /// ([`masked_device_draw`](Self::masked_device_draw)), made once the token before it is
    /// recorded.
    pub fn constrained(mut self, constraint: Constraint) -> Self {
        self.constraint = Some(constraint);
        self
    }

    /// Never draws one of `end` (the tokens that would end the generation) among the first
    /// `min` tokens (vLLM's `min_tokens`). Until then no device picks for this sampler.
    pub fn with_min_tokens(mut self, end: Vec<u32>, min: usize) -> Self {
        self.banned = end;
        self.banned_until = min as u64;
        self
    }

    /// Whether the draw after `unrecorded` more tokens may not pick an end token.
    fn banning(&self, unrecorded: u64) -> bool {
        self.min_tokens_ahead(unrecorded)
            && !self.constraint.as_ref().is_some_and(Constraint::may_end)
    }

    /// Whether fewer than the minimum of tokens will have been drawn after `unrecorded` more.
    fn min_tokens_ahead(&self, unrecorded: u64) -> bool {
        !self.banned.is_empty() && self.draws.saturating_add(unrecorded) < self.banned_until
    }

    /// Picks the next token from `logits` (modified in place) and records it.
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        if let Some(c) = &mut self.constraint {
            c.allowed().mask(logits);
        }
        self.apply_penalties(logits);
        for &(id, bias) in &self.params.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        if self.banning(0) {
            for &id in &self.banned {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        let p = &self.params;
        // As vLLM: a temperature this small is greedy (dividing by it would overflow).
        let token = if p.temperature < GREEDY_BELOW {
            argmax(logits)
        } else if p.top_k == 0 && p.top_p >= 1.0 && p.min_p <= 0.0 {
            self.sample_all(logits)
        } else {
            self.sample_ranked(logits)
        };
        self.record(token);
        token
    }

    /// Whether a recorded token broke the grammar: only where nothing was allowed, not even
    /// an end token.
    pub fn off_grammar(&self) -> bool {
        self.off_grammar
    }

    /// Whether the grammar of a constrained sampler is complete and allows nothing more.
    pub fn grammar_finished(&self) -> bool {
        self.constraint
            .as_ref()
            .is_some_and(Constraint::is_finished)
    }

    /// Records `token` as produced: by [`sample`](Self::sample), or chosen elsewhere as
    /// [`is_plain_greedy`](Self::is_plain_greedy) or [`device_draw`](Self::device_draw) allow.
    pub fn record(&mut self, token: u32) {
        if let Some(c) = &mut self.constraint
            && !c.accept(token)
        {
            self.off_grammar = true;
        }
        self.draws += 1;
        *self.generated.entry(token).or_default() += 1;
        if let Err(at) = self.seen.binary_search(&token) {
            self.seen.insert(at, token);
        }
    }

    /// From the whole distribution: the weights in vector passes, a chunk's sum at a time, then
    /// a walk in id order through the chunk where the draw falls.
    fn sample_all(&mut self, logits: &mut [f32]) -> u32 {
        if !below_infinity(logits) {
            return self.sample_all_scalar(logits);
        }
        let simd = simd();
        let max = simd.max(logits);
        if max == f32::NEG_INFINITY {
            return argmax(logits);
        }
        // Each weight is exp((l - max) / t), the difference taken before the scaling (which may
        // be by up to 1e5); -inf logits weigh 0.
        logits.iter_mut().for_each(|l| *l -= max);
        simd.scale(logits, 1.0 / self.params.temperature);
        let sums: Vec<f32> = logits
            .chunks_mut(CHUNK)
            .map(|c| simd.exp_shifted(c, 0.0))
            .collect();
        let total: f32 = sums.iter().sum();
        let mut r = self.next_f32() * total;
        for (ci, (chunk, &sum)) in logits.chunks(CHUNK).zip(&sums).enumerate() {
            if r >= sum {
                r -= sum;
                continue;
            }
            for (j, &w) in chunk.iter().enumerate() {
                if r < w {
                    return (ci * CHUNK + j) as u32;
                }
                r -= w;
            }
        }
        // Rounding left the draw past every weight: the last token with any.
        logits.iter().rposition(|&w| w > 0.0).unwrap_or(0) as u32
    }

    /// [`sample_all`](Self::sample_all) for logits with a NaN or +inf: one scalar pass in id
    /// order over the finite ones.
    fn sample_all_scalar(&mut self, logits: &[f32]) -> u32 {
        let t = self.params.temperature;
        let max = logits
            .iter()
            .filter(|l| l.is_finite())
            .fold(f32::NEG_INFINITY, |m, &l| m.max(l));
        if max == f32::NEG_INFINITY {
            return argmax(logits);
        }
        let weights: Vec<f32> = logits
            .iter()
            .map(|&l| {
                if l.is_finite() {
                    ((l - max) / t).exp()
                } else {
                    0.0
                }
            })
            .collect();
        let total: f32 = weights.iter().sum();
        let mut r = self.next_f32() * total;
        let mut pick = argmax(logits);
        for (i, &w) in weights.iter().enumerate() {
            if w > 0.0 {
                pick = i as u32;
                if r < w {
                    break;
                }
                r -= w;
            }
        }
        pick
    }

    /// With top-k, top-p or min-p: the candidates ranked by logit (ties to the lower id).
    fn sample_ranked(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        if p.top_k == 0 && below_infinity(logits) {
            let max = simd().max(logits);
            let bar = max - GAP * p.temperature;
            // A vectorized count, no early exit.
            let near = logits
                .iter()
                .fold(0usize, |n, &l| n + usize::from(l >= bar));
            if max > f32::NEG_INFINITY && near > LADDER_FROM {
                let (top_p, min_p, inv_t) = (p.top_p, p.min_p, 1.0 / p.temperature);
                let u = self.next_f32();
                return ladder::draw(simd(), logits, max, inv_t, top_p, min_p, u);
            }
        }
        let (mut cand, total) = match quick_candidates(logits, p) {
            Some(c) => c,
            None => all_candidates(logits, p),
        };
        if cand.is_empty() {
            return argmax(logits);
        }
        let max = cand.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.1));
        if cand.len() > HEAD && (p.top_p < 1.0 || p.min_p > 0.0) {
            // top-p and min-p keep a prefix of the ranking; when it ends within the best HEAD
            // candidates, only those need sorting.
            let min_p_kept = if p.min_p > 0.0 {
                // In the log domain, the floor a hair low so the count errs high: an over-count
                // only keeps the whole ranking.
                let floor = max + p.min_p.ln() - 1e-4;
                cand.iter().filter(|c| c.1 >= floor).count()
            } else {
                0
            };
            cand.select_nth_unstable_by(HEAD - 1, rank_order);
            let head_mass: f32 = cand[..HEAD].iter().map(|c| (c.1 - max).exp() / total).sum();
            if (p.top_p < 1.0 && head_mass >= p.top_p) || (p.min_p > 0.0 && min_p_kept <= HEAD) {
                cand.truncate(HEAD);
            }
        }
        cand.sort_unstable_by(rank_order);
        let probs: Vec<f32> = cand.iter().map(|c| (c.1 - max).exp() / total).collect();
        let mut keep = probs.len();
        if p.min_p > 0.0 {
            keep = keep.min(
                probs
                    .iter()
                    .take_while(|&&x| x >= p.min_p * probs[0])
                    .count(),
            );
        }
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            let n = probs.iter().take_while(|&&x| {
                let before = acc;
                acc += x;
                before < p.top_p
            });
            keep = keep.min(n.count());
        }
        let keep = keep.max(1);
        let mass: f32 = probs[..keep].iter().sum();
        let mut r = self.next_f32() * mass;
        let mut pick = cand[keep - 1].0;
        for (c, &pr) in cand[..keep].iter().zip(&probs[..keep]) {
            if r < pr {
                pick = c.0;
                break;
            }
            r -= pr;
        }
        pick
    }

    fn apply_penalties(&self, logits: &mut [f32]) {
        let p = &self.params;
        if p.repetition_penalty != 1.0 {
            for &t in &self.seen {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 {
                        *l / p.repetition_penalty
                    } else {
                        *l * p.repetition_penalty
                    };
                }
            }
        }
        if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
            for (&t, &n) in &self.generated {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l -= p.frequency_penalty * n as f32 + p.presence_penalty;
                }
            }
        }
    }

    /// xorshift64*: reproducible for a seed on every machine.
    fn next_f32(&mut self) -> f32 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let x = self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (x >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// Temperatures below this sample greedily.
const GREEDY_BELOW: f32 = 1e-5;
/// Logits a vector pass turns into weights at once.
const CHUNK: usize = 4096;
/// Candidates for a top-p or min-p cut are first the tokens within this many nats (after the
/// temperature) of the best: the rest weigh at most e^-16 of it each.
const GAP: f32 = 16.0;
/// A top-p or min-p cut with more tokens than this near the best (within [`GAP`]) goes through
/// a [`ladder`] of buckets instead of a sort.
const LADDER_FROM: usize = 8192;
/// A top-k up to this size is kept in a heap during one pass over the logits.
const HEAP_K: usize = 4096;

fn simd() -> Simd {
    static SIMD: OnceLock<Simd> = OnceLock::new();
    *SIMD.get_or_init(Simd::detect)
}

/// No NaN and no +inf (vector passes need neither).
fn below_infinity(logits: &[f32]) -> bool {
    // A fold rather than `all`: no early exit, so the pass vectorizes.
    !logits
        .iter()
        .fold(false, |bad, &l| bad | l.is_nan() | (l == f32::INFINITY))
}

/// Orders by logit, then by the lower id: greater is better.
#[derive(PartialEq)]
struct Ranked(f32, u32);

impl Eq for Ranked {}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> Ordering {
        key_order(self.0, other.0).then(other.1.cmp(&self.1))
    }
}

/// The sum of exp((l - max) / t) over `logits`, in vector passes over a copy of each chunk.
fn weight_total(logits: &[f32], inv_t: f32, max: f32) -> f32 {
    let simd = simd();
    let mut buf = [0f32; CHUNK];
    logits
        .chunks(CHUNK)
        .map(|c| {
            let b = &mut buf[..c.len()];
            b.iter_mut().zip(c).for_each(|(b, &l)| *b = l - max);
            simd.scale(b, inv_t);
            simd.exp_shifted(b, 0.0)
        })
        .sum()
}

/// Candidates `(id, (logit - best) / t)` holding every token the cuts can keep, and the softmax
/// denominator (over the top k with top-k, else over every finite logit), found without ranking
/// the whole vocabulary; `None` when that cannot be shown.
fn quick_candidates(logits: &[f32], p: &SamplingParams) -> Option<(Vec<(u32, f32)>, f32)> {
    if !below_infinity(logits) {
        return None;
    }
    let max = simd().max(logits);
    if max == f32::NEG_INFINITY {
        return Some((Vec::new(), 0.0));
    }
    let inv_t = 1.0 / p.temperature;
    if p.top_k > 0 && p.top_k <= HEAP_K {
        // A min-heap of the best k so far, ranked as `rank_order` ranks: its root is the worst
        // kept.
        let mut heap: BinaryHeap<Reverse<Ranked>> = BinaryHeap::with_capacity(p.top_k + 1);
        for (i, &l) in logits.iter().enumerate() {
            if l == f32::NEG_INFINITY {
                continue;
            }
            let v = (l - max) * inv_t;
            if heap.len() < p.top_k {
                heap.push(Reverse(Ranked(v, i as u32)));
            } else if let Some(w) = heap.peek()
                // Most tokens fall below the root at the first comparison.
                && v >= w.0.0
                && Ranked(v, i as u32) > w.0
            {
                heap.pop();
                heap.push(Reverse(Ranked(v, i as u32)));
            }
        }
        let cand: Vec<(u32, f32)> = heap
            .into_iter()
            .map(|Reverse(Ranked(v, i))| (i, v))
            .collect();
        let total = cand.iter().map(|c| c.1.exp()).sum();
        return Some((cand, total));
    }
    if p.top_k > 0 {
        return None;
    }
    let bar = max - GAP * p.temperature;
    let cand: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|&(_, &l)| l >= bar && l > f32::NEG_INFINITY)
        .map(|(i, &l)| (i as u32, (l - max) * inv_t))
        .collect();
    let total = weight_total(logits, inv_t, max);
    // The kept are a prefix of the ranking: within the candidates when min-p's floor is above
    // the bar (by a nat, for rounding), or when the candidates alone reach top-p's mass (with a
    // margin for rounding).
    let within_min_p = p.min_p > 0.0 && p.min_p.ln() >= 1.0 - GAP;
    let mass: f32 = cand.iter().map(|c| c.1.exp()).sum();
    let within_top_p = p.top_p < 1.0 && mass >= p.top_p * total * (1.0 + 1e-4);
    (within_min_p || within_top_p).then_some((cand, total))
}

/// Every finite logit as a candidate `(id, (logit - best) / t)`, cut to the top k when there is
/// one, and the softmax denominator over them.
fn all_candidates(logits: &[f32], p: &SamplingParams) -> (Vec<(u32, f32)>, f32) {
    let best = logits
        .iter()
        .filter(|l| l.is_finite())
        .fold(f32::NEG_INFINITY, |m, &l| m.max(l));
    let mut cand: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| l.is_finite())
        .map(|(i, &l)| (i as u32, (l - best) / p.temperature))
        .collect();
    if p.top_k > 0 && p.top_k < cand.len() {
        // Only the k best need sorting.
        cand.select_nth_unstable_by(p.top_k - 1, rank_order);
        cand.truncate(p.top_k);
    }
    let max = cand.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.1));
    let total = cand.iter().map(|c| (c.1 - max).exp()).sum();
    (cand, total)
}

/// Best first: by logit, then by the lower id.
fn rank_order(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    key_order(b.1, a.1).then(a.0.cmp(&b.0))
}

/// A total order of ranking keys in which -0.0 equals 0.0: the shift by the best gives either
/// zero to a token that ties it, depending on which zero the maximum returned.
fn key_order(a: f32, b: f32) -> Ordering {
    // Adding 0.0 turns -0.0 into 0.0 and leaves every other value as it is.
    (a + 0.0).total_cmp(&(b + 0.0))
}
/// Candidates a top-p or min-p cut is first looked for among.
const HEAD: usize = 1024;

fn splitmix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Index of the largest logit (the lowest index among equals).
pub fn argmax(logits: &[f32]) -> u32 {
    if below_infinity(logits) {
        let max = simd().max(logits);
        return logits.iter().position(|&l| l == max).unwrap_or(0) as u32;
    }
    // NaN ranks below everything, wherever it sits.
    let mut best: Option<usize> = None;
    for (i, &l) in logits.iter().enumerate() {
        if !l.is_nan() && best.is_none_or(|b| l > logits[b]) {
            best = Some(i);
        }
    }
    best.unwrap_or(0) as u32
}

/// The seed of choice `i` of a request seeded with `seed`: the seed itself for the first, and
/// for the others seeds no nearby request seed gives its first choice.
pub fn choice_seed(seed: u64, i: u64) -> u64 {
    if i == 0 {
        seed
    } else {
        splitmix(seed ^ splitmix(i))
    }
}

/// A request's seed where it gives none: well mixed, so that consecutive requests' choices do
/// not share seeds.
pub fn unseeded(counter: u64, salt: u64) -> u64 {
    splitmix(counter ^ salt)
}
