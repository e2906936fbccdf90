//! Log-probabilities of a row of logits: a token's, and the most likely tokens'.

/// A token's log-probability and the most likely alternatives at its position.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
    /// 1 + the number of tokens more likely than `token`, where it was counted: a prompt token's
    /// on the CPU (vLLM's `prompt_logprobs` give it), not on a GPU nor for a generated token.
    pub rank: Option<u32>,
}

/// Log-probabilities of `logits` (unmodified by sampling): the chosen token's and the `top` best.
pub fn token_logprob(logits: &[f32], chosen: u32, top: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&x| ((x - max) as f64).exp()).sum();
    let lse = max + sum.ln() as f32;
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (i, &x) in logits.iter().enumerate() {
            if best.len() < top || x > best[best.len() - 1].1 {
                let at = best.partition_point(|&(_, y)| y >= x);
                best.insert(at, (i as u32, x));
                best.truncate(top);
            }
        }
    }
    let x = logits[chosen as usize];
    TokenLogprob {
        token: chosen,
        logprob: x - lse,
        top: best.into_iter().map(|(t, x)| (t, x - lse)).collect(),
        rank: Some(1 + logits.iter().filter(|&&y| y > x).count() as u32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_normalised_and_sorted() {
        let logits = [1.0f32, 3.0, 2.0, -1.0];
        let lp = token_logprob(&logits, 2, 3);
        let total: f32 = logits
            .iter()
            .map(|&x| (token_logprob(&logits, 0, 0).logprob - logits[0] + x).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-5);
        assert_eq!(
            lp.top.iter().map(|t| t.0).collect::<Vec<_>>(),
            vec![1, 2, 0]
        );
        assert!((lp.logprob - lp.top[1].1).abs() < 1e-6);
        assert_eq!(lp.rank, Some(2));
        assert_eq!(token_logprob(&logits, 3, 0).rank, Some(4));
    }
}
