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
            seed: 0,
        }
    }
}

impl SamplingParams {
    pub fn validate(&self) -> Result<(), String> {
        let check = |ok: bool, msg: &str| if ok { Ok(()) } else { Err(msg.to_string()) };
        check(
            self.temperature.is_finite() && self.temperature >= 0.0,
            "temperature must be >= 0",
        )?;
        check(
            self.top_p > 0.0 && self.top_p <= 1.0,
            "top_p must be in (0, 1]",
        )?;
        check((0.0..=1.0).contains(&self.min_p), "min_p must be in [0, 1]")?;
        check(
            self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0,
            "repetition_penalty must be > 0",
        )?;
        check(
            (-2.0..=2.0).contains(&self.frequency_penalty),
            "frequency_penalty must be in [-2, 2]",
        )?;
        check(
            (-2.0..=2.0).contains(&self.presence_penalty),
            "presence_penalty must be in [-2, 2]",
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
        let rng = params.seed ^ 0x9E37_79B9_7F4A_7C15;
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
        let p = &self.params;
        let token = if p.temperature == 0.0 {
            argmax(logits)
        } else {
            let mut cand: Vec<(u32, f32)> = logits
                .iter()
                .enumerate()
                .filter(|(_, l)| l.is_finite())
                .map(|(i, &l)| (i as u32, l / p.temperature))
                .collect();
            if cand.is_empty() {
                return argmax(logits);
            }
            cand.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            if p.top_k > 0 {
                cand.truncate(p.top_k);
            }
            let max = cand[0].1;
            let mut probs: Vec<f32> = cand.iter().map(|c| (c.1 - max).exp()).collect();
            let total: f32 = probs.iter().sum();
            probs.iter_mut().for_each(|x| *x /= total);
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
        };
        *self.generated.entry(token).or_default() += 1;
        self.seen.push(token);
        token
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
