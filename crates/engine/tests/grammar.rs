//! Requests held to a grammar in the engine: how they end.

mod common;

use std::sync::Arc;

use common::*;
use tokio::sync::mpsc::unbounded_channel;
use vortex_engine::{Event, FinishReason};
use vortex_model::grammar::{Grammar, Matcher, Numeric, Rule};
use vortex_model::model::CpuPass;
use vortex_model::random::TINY_EOS;
use vortex_model::sampling::SamplingParams;

/// `ignore_eos` lets a free reply write past the end token; a reply held to a grammar may not:
/// the grammar offers the end token only where its value may end, and there it ends.
#[test]
fn an_end_token_ends_a_held_reply_even_with_ignore_eos() {
    let m = model();
    // `{"type": "integer"}`: complete after a digit, which more digits may follow.
    let grammar = Arc::new(Grammar {
        rules: vec![Rule {
            number: Some(Numeric::Integer),
            ..Rule::default()
        }],
        root: 0,
    });
    for seed in 0..4 {
        let mut s = spec(&prompt(seed, 8), 30);
        s.ignore_eos = true;
        s.skip_special = false;
        s.grammar = Some(grammar.clone());
        s.sampling = SamplingParams {
            temperature: 1.0,
            seed: seed as u64,
            // The end token, wherever it is allowed.
            logit_bias: vec![(TINY_EOS, 50.0)],
            ..Default::default()
        };
        let (mut e, _) = engine_on(&m, Box::new(CpuPass), 64, 4, false);
        let (tx, mut rx) = unbounded_channel();
        e.submit(s, tx);
        let mut steps = 0;
        while !e.is_idle() {
            e.step();
            steps += 1;
            assert!(steps < 1000);
        }
        let (mut text, mut tokens, mut end) = (String::new(), Vec::new(), None);
        while let Ok(ev) = rx.try_recv() {
            match ev {
                Event::Delta {
                    text: t, tokens: k, ..
                } => {
                    text.push_str(&t);
                    tokens.extend(k);
                }
                Event::Finished { reason, .. } => end = Some(reason),
                Event::Failed(why) | Event::Refused(why) => panic!("{why}"),
            }
        }
        let mut matcher = Matcher::new(grammar.clone());
        assert!(
            matcher.advance(text.as_bytes()) && matcher.is_complete(),
            "seed {seed}: {text:?}"
        );
        assert!(!tokens.contains(&TINY_EOS), "seed {seed}: {tokens:?}");
        assert_eq!(end, Some(FinishReason::Stop), "seed {seed}: {text:?}");
    }
}
