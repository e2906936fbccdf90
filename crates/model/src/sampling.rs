//! Choosing the next token from logits: penalties, temperature, top-k, top-p, min-p, seeded.

use std::collections::HashMap;

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
            ">= 0",
        )?;
        check(self.top_p > 0.0 && self.top_p <= 1.0, "top_p", "in (0, 1]")?;
        check((0.0..=1.0).contains(&self.min_p), "min_p", "in [0, 1]")?;
        check(
            self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0,
            "repetition_penalty",
            "> 0",
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
    /// Prompt and generated tokens, for the repetition penalty.
    seen: Vec<u32>,
}

impl Sampler {
    pub fn new(params: SamplingParams, prompt: &[u32]) -> Self {
        // Every seed gives a non-zero xorshift state (one that is zero stays zero).
        let rng = splitmix(params.seed) | 1;
        Self {
            params,
            rng,
            generated: HashMap::new(),
            seen: prompt.to_vec(),
        }
    }

    /// Picks the next token from `logits` (modified in place) and records it.
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        self.apply_penalties(logits);
        for &(id, bias) in &self.params.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
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
        *self.generated.entry(token).or_default() += 1;
        self.seen.push(token);
        token
    }

    /// From the whole distribution, in one pass over the vocabulary in id order.
    fn sample_all(&mut self, logits: &[f32]) -> u32 {
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
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .map(|(i, &l)| (i as u32, l / p.temperature))
            .collect();
        if cand.is_empty() {
            return argmax(logits);
        }
        let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < cand.len() {
            // Only the k best need sorting.
            cand.select_nth_unstable_by(p.top_k - 1, order);
            cand.truncate(p.top_k);
        }
        // The probabilities are over the candidates so far, however many are then sorted.
        let max = cand.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.1));
        let total: f32 = cand.iter().map(|c| (c.1 - max).exp()).sum();
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
            cand.select_nth_unstable_by(HEAD - 1, order);
            let head_mass: f32 = cand[..HEAD].iter().map(|c| (c.1 - max).exp() / total).sum();
            if (p.top_p < 1.0 && head_mass >= p.top_p) || (p.min_p > 0.0 && min_p_kept <= HEAD) {
                cand.truncate(HEAD);
            }
        }
        cand.sort_unstable_by(order);
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
            let mut seen = self.seen.clone();
            seen.sort_unstable();
            seen.dedup();
            for t in seen {
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
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}
