//! Which tokens each running request computes in a step: decodes first, then prefill chunks,
//! under a per-step token budget.

/// Limits of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepBudget {
    /// Tokens computed in one forward pass, decodes and prefill chunks together.
    pub max_batch_tokens: usize,
    /// Prompt tokens one request computes per step (at least 2; 2 takes the last 3 of a prompt
    /// at once).
    pub prefill_chunk: usize,
}

/// Tokens each request computes this step (0: it waits), given the tokens each has `pending`.
///
/// A request with one pending token decodes. A prefill chunk is never a single token while
/// more are pending: single tokens run through the flow's sparse decode path, and prompt pages
/// must hold dense-attention KV to be shareable through the prefix cache.
pub fn plan(pending: &[usize], budget: StepBudget) -> Vec<usize> {
    let mut left = budget.max_batch_tokens;
    let mut take = vec![0; pending.len()];
    for (t, &p) in take.iter_mut().zip(pending) {
        if p == 1 && left > 0 {
            *t = 1;
            left -= 1;
        }
    }
    // Once a prompt waits for budget, later ones wait too: taking what it could not use would
    // let a steady stream of later prompts hold it back for ever.
    let mut blocked = false;
    for (t, &p) in take.iter_mut().zip(pending) {
        if p < 2 || blocked {
            continue;
        }
        let mut chunk = p.min(budget.prefill_chunk).min(left);
        if chunk < p && p - chunk == 1 {
            // One fewer, or for a chunk of 2 the whole 3 when the step has room: a chunk of 1
            // would be a decode.
            chunk = if chunk > 2 || chunk + 1 > left {
                chunk - 1
            } else {
                chunk + 1
            };
        }
        if chunk >= 2 {
            *t = chunk;
            left -= chunk;
        } else {
            blocked = true;
        }
    }
    take
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: StepBudget = StepBudget {
        max_batch_tokens: 10,
        prefill_chunk: 4,
    };

    #[test]
    fn decodes_go_first_then_chunks_fill_the_budget() {
        assert_eq!(plan(&[9, 1, 1, 6], B), vec![4, 1, 1, 4]);
        assert_eq!(plan(&[3, 3, 3, 3], B), vec![3, 3, 3, 0]);
        assert_eq!(plan(&[0, 1], B), vec![0, 1]);
    }

    #[test]
    fn never_leaves_or_takes_a_single_prompt_token() {
        // 5 pending with chunk 4 would leave 1: take 3, then 2.
        assert_eq!(plan(&[5], B), vec![3]);
        assert_eq!(plan(&[2], B), vec![2]);
        // Budget of 1 left: the prefill waits rather than taking one token.
        let tight = StepBudget {
            max_batch_tokens: 3,
            prefill_chunk: 4,
        };
        assert_eq!(plan(&[1, 1, 8], tight), vec![1, 1, 0]);
        // Every prompt finishes, in chunks of 2 or more, for every chunk size and any budget
        // of 3 or more.
        for prefill_chunk in 2..7 {
            for max_batch_tokens in 3..9 {
                let b = StepBudget {
                    max_batch_tokens,
                    prefill_chunk,
                };
                for p in 2..40 {
                    let mut left = p;
                    while left > 0 {
                        let t = plan(&[left], b)[0];
                        assert!(t >= 2, "{b:?}: pending {left} took {t}");
                        left -= t;
                    }
                }
            }
        }
    }

    #[test]
    fn a_prompt_waiting_for_budget_is_not_overtaken() {
        let b = StepBudget {
            max_batch_tokens: 3,
            prefill_chunk: 16,
        };
        // The 3-token prompt cannot take the 2 left (that would leave 1): the 4-token prompt
        // behind it waits too.
        assert_eq!(plan(&[1, 3, 4], b), vec![1, 0, 0]);
        assert_eq!(plan(&[3, 4], b), vec![3, 0]);
    }

    #[test]
    fn decodes_beyond_the_budget_wait() {
        let tight = StepBudget {
            max_batch_tokens: 2,
            prefill_chunk: 4,
        };
        assert_eq!(plan(&[1, 1, 1], tight), vec![1, 1, 0]);
    }
}
