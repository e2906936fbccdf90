//! What each request asks for: lengths drawn once per run, prompts of random token ids drawn
//! afresh for each level (so no level finds the previous one's prompts in the prefix cache), and
//! the JSON body sent to `/v1/completions`.

use rand::{Rng, SeedableRng, rngs::StdRng};
use serde_json::{Map, Value, json};

use super::dist::Dist;

/// The lengths of one request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lengths {
    /// Prompt tokens after the shared prefix.
    pub input: usize,
    /// Tokens to generate (`max_tokens`, with `ignore_eos`).
    pub output: usize,
}

pub fn draw_lengths(n: usize, input: &Dist, output: &Dist, seed: u64) -> Vec<Lengths> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| Lengths {
            input: input.sample(&mut rng),
            output: output.sample(&mut rng),
        })
        .collect()
}

/// Parses `--vocab-range LO:HI`: token ids are drawn from `LO..HI`.
pub fn parse_vocab_range(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("'{s}' is not a token id range: give LO:HI with 0 <= LO < HI");
    let (a, b) = s.split_once(':').ok_or_else(bad)?;
    let lo = a.trim().parse::<u32>().map_err(|_| bad())?;
    let hi = b.trim().parse::<u32>().map_err(|_| bad())?;
    if lo >= hi {
        return Err(bad());
    }
    Ok((lo, hi))
}

/// Prompts for one level: `prefix` shared tokens, then `input` random ids per request.
pub fn draw_prompts(
    lengths: &[Lengths],
    prefix: usize,
    vocab: (u32, u32),
    seed: u64,
) -> Vec<Vec<u32>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let shared: Vec<u32> = (0..prefix)
        .map(|_| rng.random_range(vocab.0..vocab.1))
        .collect();
    lengths
        .iter()
        .map(|l| {
            let mut p = Vec::with_capacity(prefix + l.input);
            p.extend_from_slice(&shared);
            p.extend((0..l.input).map(|_| rng.random_range(vocab.0..vocab.1)));
            p
        })
        .collect()
}

/// The body of a streamed completion: exact prompt length through token ids, exact output
/// length through `ignore_eos`, a usage chunk at the end. `extra` keys override.
pub fn completion_body(
    model: &str,
    prompt: &[u32],
    max_tokens: usize,
    vortex: Option<&Value>,
    extra: &Map<String, Value>,
) -> Value {
    let mut body = json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
        "ignore_eos": true,
    });
    let obj = body.as_object_mut().unwrap();
    if let Some(v) = vortex {
        obj.insert("vortex".into(), v.clone());
    }
    for (k, v) in extra {
        obj.insert(k.clone(), v.clone());
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_have_exact_lengths_and_fresh_ids_per_seed() {
        let lengths = draw_lengths(
            50,
            &Dist::parse("10:20").unwrap(),
            &Dist::parse("5").unwrap(),
            3,
        );
        assert_eq!(
            lengths,
            draw_lengths(
                50,
                &Dist::parse("10:20").unwrap(),
                &Dist::parse("5").unwrap(),
                3
            )
        );
        let a = draw_prompts(&lengths, 4, (1000, 10000), 1);
        let b = draw_prompts(&lengths, 4, (1000, 10000), 2);
        for (i, l) in lengths.iter().enumerate() {
            assert_eq!(l.output, 5);
            assert_eq!(a[i].len(), 4 + l.input);
            assert!(a[i].iter().all(|&t| (1000..10000).contains(&t)));
            assert_eq!(a[i][..4], a[0][..4]);
        }
        assert_ne!(a, b);
    }

    #[test]
    fn body_fields() {
        let mut extra = Map::new();
        extra.insert("temperature".into(), json!(0.0));
        let vortex = json!({"flow": "block_topk", "budget": 64});
        let b = completion_body("m", &[5, 6], 16, Some(&vortex), &extra);
        assert_eq!(b["prompt"], json!([5, 6]));
        assert_eq!(b["max_tokens"], 16);
        assert_eq!(b["stream"], true);
        assert_eq!(b["stream_options"]["include_usage"], true);
        assert_eq!(b["ignore_eos"], true);
        assert_eq!(b["vortex"]["flow"], "block_topk");
        assert_eq!(b["temperature"], 0.0);
        let b = completion_body("m", &[5], 1, None, &Map::new());
        assert!(b.get("vortex").is_none());
    }

    #[test]
    fn vocab_range() {
        assert_eq!(parse_vocab_range("1000:10000").unwrap(), (1000, 10000));
        for bad in ["5:5", "9:1", "x:2", "100", "-1:5"] {
            assert!(parse_vocab_range(bad).is_err(), "{bad}");
        }
    }
}
