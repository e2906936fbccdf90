use vortex_model::generate::StopStream;
use vortex_model::sampling::{DeviceDraw, Sampler, SamplingParams, argmax, choice_seed};

fn logits() -> Vec<f32> {
    (0..100).map(|i| ((i * 37) % 100) as f32 / 10.0).collect()
}

#[test]
fn greedy_picks_the_largest() {
    let mut s = Sampler::new(SamplingParams::default(), &[]);
    let mut l = logits();
    assert_eq!(s.sample(&mut l), argmax(&logits()));
}

#[test]
fn same_seed_same_tokens_different_seed_differs() {
    let p = SamplingParams {
        temperature: 1.0,
        seed: 42,
        ..Default::default()
    };
    let run = |p: &SamplingParams| {
        let mut s = Sampler::new(p.clone(), &[]);
        (0..50).map(|_| s.sample(&mut logits())).collect::<Vec<_>>()
    };
    assert_eq!(run(&p), run(&p));
    assert_ne!(
        run(&p),
        run(&SamplingParams {
            seed: 43,
            ..p.clone()
        })
    );
}

#[test]
fn top_k_one_tiny_top_p_and_high_min_p_are_greedy() {
    let best = argmax(&logits());
    for p in [
        SamplingParams {
            temperature: 1.5,
            top_k: 1,
            seed: 1,
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.5,
            top_p: 1e-6,
            seed: 2,
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.5,
            min_p: 1.0,
            seed: 3,
            ..Default::default()
        },
    ] {
        let mut s = Sampler::new(p, &[]);
        for _ in 0..20 {
            assert_eq!(s.sample(&mut logits()), best);
        }
    }
}

#[test]
fn top_k_limits_the_candidates() {
    let mut sorted: Vec<(usize, f32)> = logits().into_iter().enumerate().collect();
    sorted.sort_by(|a, b| b.1.total_cmp(&a.1));
    let allowed: Vec<u32> = sorted[..3].iter().map(|x| x.0 as u32).collect();
    let mut s = Sampler::new(
        SamplingParams {
            temperature: 5.0,
            top_k: 3,
            seed: 9,
            ..Default::default()
        },
        &[],
    );
    let picks: Vec<u32> = (0..200).map(|_| s.sample(&mut logits())).collect();
    assert!(picks.iter().all(|t| allowed.contains(t)));
    assert!(
        allowed.iter().all(|t| picks.contains(t)),
        "high temperature should visit all three"
    );
}

#[test]
fn penalties_steer_away_from_repeats() {
    let best = argmax(&logits());
    let mut s = Sampler::new(
        SamplingParams {
            presence_penalty: 2.0,
            frequency_penalty: 2.0,
            ..Default::default()
        },
        &[],
    );
    let first = s.sample(&mut logits());
    assert_eq!(first, best);
    assert_ne!(
        s.sample(&mut logits()),
        best,
        "a generated token is penalised"
    );
    let mut s = Sampler::new(
        SamplingParams {
            repetition_penalty: 100.0,
            ..Default::default()
        },
        &[best],
    );
    assert_ne!(s.sample(&mut logits()), best, "a prompt token is penalised");
}

#[test]
fn logit_bias_moves_the_choice() {
    let best = Sampler::new(SamplingParams::default(), &[]).sample(&mut logits());
    let other = (best + 1) % logits().len() as u32;
    for temperature in [0.0, 1.0] {
        let mut s = Sampler::new(
            SamplingParams {
                temperature,
                logit_bias: vec![(other, 100.0), (u32::MAX, 5.0)],
                ..Default::default()
            },
            &[],
        );
        assert_eq!(s.sample(&mut logits()), other, "+100 forces a token");
        let mut s = Sampler::new(
            SamplingParams {
                temperature,
                logit_bias: vec![(best, -100.0)],
                ..Default::default()
            },
            &[],
        );
        assert!(
            (0..20).all(|_| s.sample(&mut logits()) != best),
            "-100 bans a token"
        );
    }
}

#[test]
fn invalid_parameters_are_rejected() {
    for p in [
        SamplingParams {
            logit_bias: vec![(1, 101.0)],
            ..Default::default()
        },
        SamplingParams {
            temperature: -1.0,
            ..Default::default()
        },
        SamplingParams {
            top_p: 0.0,
            ..Default::default()
        },
        SamplingParams {
            min_p: 2.0,
            ..Default::default()
        },
        SamplingParams {
            repetition_penalty: 0.0,
            ..Default::default()
        },
        SamplingParams {
            frequency_penalty: 3.0,
            ..Default::default()
        },
    ] {
        assert!(p.validate().is_err(), "{p:?}");
    }
}

#[test]
fn stop_strings_end_the_text_and_are_never_emitted() {
    let stops = vec!["STOP".to_string(), "\n\n".to_string()];
    let mut st = StopStream::new(&stops);
    let mut seen = String::new();
    let mut emit = |s: &str| seen.push_str(s);
    for piece in ["Hello, wo", "rld ST", "O"] {
        assert!(!st.push(piece, &mut emit));
    }
    assert!(st.push("P and more", &mut emit));
    assert_eq!(st.text, "Hello, world ");
    assert_eq!(seen, "Hello, world ");
    // A held-back prefix that does not become a stop string is released.
    let mut st = StopStream::new(&stops);
    let mut seen = String::new();
    let mut emit = |s: &str| seen.push_str(s);
    st.push("end\n", &mut emit);
    st.push("x", &mut emit);
    st.flush(&mut emit);
    assert_eq!(seen, "end\nx");
}

#[test]
fn a_kept_stop_string_ends_the_text() {
    let stops = vec!["ST".to_string(), "STOP".to_string(), "X".to_string()];
    let mut st = StopStream::new(&stops).keeping_stop(true);
    let mut seen = String::new();
    let mut emit = |s: &str| seen.push_str(s);
    assert!(!st.push("Hello S", &mut emit));
    // "ST" and "STOP" both start here: "ST" completes first, as token by token.
    assert!(st.push("TOP, X", &mut emit));
    assert_eq!((st.text.as_str(), seen.as_str()), ("Hello ST", "Hello ST"));
}

/// Without top-k, top-p or min-p a token is drawn from the whole softmax; a vanishing
/// temperature is greedy; every seed samples (none leaves the random stream stuck).
#[test]
fn full_distribution_sampling_follows_the_softmax() {
    for seed in [5, 0x9E37_79B9_7F4A_7C15] {
        let mut s = Sampler::new(
            SamplingParams {
                temperature: 1.0,
                seed,
                ..Default::default()
            },
            &[],
        );
        let mut counts = [0usize; 3];
        for _ in 0..20_000 {
            let mut l = vec![0.0, 3f32.ln(), f32::NEG_INFINITY];
            counts[s.sample(&mut l) as usize] += 1;
        }
        assert_eq!(counts[2], 0, "seed {seed}");
        let share = counts[1] as f64 / 20_000.0;
        assert!((share - 0.75).abs() < 0.02, "seed {seed}: {share}");
    }
    let mut s = Sampler::new(
        SamplingParams {
            temperature: 1e-30,
            seed: 1,
            ..Default::default()
        },
        &[],
    );
    for _ in 0..20 {
        assert_eq!(s.sample(&mut logits()), argmax(&logits()));
    }
}

/// A prompt is prefilled in passes of at most the chunk, none of them a lone token (which would
/// decode through the flow) unless the prompt is one token.
#[test]
fn prefill_never_ends_on_one_token() {
    use vortex_model::generate::prefill_chunks;
    let prompt: Vec<u32> = (0..100).collect();
    for len in 1..40 {
        for chunk in 2..9 {
            let passes = prefill_chunks(&prompt[..len], chunk);
            let lens: Vec<usize> = passes.iter().map(|p| p.len()).collect();
            assert_eq!(passes.concat(), prompt[..len], "{len}/{chunk}");
            assert!(
                lens.iter().all(|&l| l >= 2) || len == 1,
                "{len}/{chunk}: {lens:?}"
            );
            assert!(
                lens.iter().all(|&l| l <= chunk + 1),
                "{len}/{chunk}: {lens:?}"
            );
        }
    }
}

/// top-p keeps the smallest prefix of the ranking whose mass reaches p, and min-p the tokens at
/// least that share of the best, whether few tokens lie near the best (found among them alone)
/// or very many (bucketed by weight: 20,000 here).
#[test]
fn top_p_and_min_p_keep_the_nucleus_short_or_long() {
    // Geometric probabilities, e^-0.01 apart: the nucleus of 0.5 is the first 70 tokens.
    let decaying: Vec<f32> = (0..5000).map(|i| -0.01 * i as f32).collect();
    // e^-0.0005 apart: the nucleus of 0.5 is the first 1387 (of 20,000), and so is min-p 0.5.
    let slow: Vec<f32> = (0..20_000).map(|i| -0.0005 * i as f32).collect();
    // Equal probabilities, ties ranked by id: the nucleus of 0.5 is the first half.
    for (logits, top_p, min_p, nucleus) in [
        (decaying, 0.5, 0.0, 70),
        (vec![0.0f32; 5000], 0.5, 0.0, 2500),
        (slow.clone(), 0.5, 0.0, 1387),
        (slow, 1.0, 0.5, 1387),
        (vec![0.0f32; 20_000], 0.5, 0.0, 10_000),
    ] {
        let vocab = logits.len();
        let mut s = Sampler::new(
            SamplingParams {
                temperature: 1.0,
                top_p,
                min_p,
                seed: 3,
                ..Default::default()
            },
            &[],
        );
        let mut seen = vec![0usize; vocab];
        let draws = if vocab > 5000 { 2000 } else { 10_000 };
        for _ in 0..draws {
            seen[s.sample(&mut logits.clone()) as usize] += 1;
        }
        let last = seen.iter().rposition(|&c| c > 0).unwrap();
        let first = seen.iter().position(|&c| c > 0).unwrap();
        assert!(
            first == 0 && last < nucleus && last + nucleus / 200 + 3 >= nucleus,
            "{vocab} tokens, top-p {top_p}, min-p {min_p}: drew {first} to {last}, nucleus {nucleus}"
        );
    }
}

/// A top-k over equal logits keeps the lowest ids.
#[test]
fn top_k_ties_keep_the_lower_ids() {
    let mut s = Sampler::new(
        SamplingParams {
            temperature: 1.0,
            top_k: 3,
            seed: 9,
            ..Default::default()
        },
        &[],
    );
    let mut counts = [0usize; 3];
    for _ in 0..3000 {
        let t = s.sample(&mut vec![0.0f32; 10_000]) as usize;
        assert!(t < 3, "drew {t}");
        counts[t] += 1;
    }
    assert!(counts.iter().all(|&c| c > 800), "{counts:?}");
}

/// With a top-k, top-p or min-p cut, the candidates found without ranking the vocabulary (logits
/// without NaN or +inf) draw what the full ranking draws: one token made -inf on one side and NaN
/// (which also weighs nothing, and sends the sampler to the full ranking) on the other. A draw
/// from a nucleus of tens of thousands of tokens walks their running mass, summed in another
/// order on each side: it may land a few ranks away, never further.
#[test]
fn quick_candidates_draw_as_the_full_ranking() {
    let vocab = 50_000;
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut uniform = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ((x >> 40) as f64 + 0.5) / (1u64 << 24) as f64
    };
    let logits: Vec<f32> = (0..vocab)
        .map(|_| {
            let (u, v) = (uniform(), uniform());
            (2.5 * (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
        })
        .collect();
    let mut order: Vec<usize> = (0..vocab).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let mut rank = vec![0usize; vocab];
    for (r, &i) in order.iter().enumerate() {
        rank[i] = r;
    }
    for (k, p, min_p, t) in [
        (50, 1.0, 0.0, 0.7),
        (0, 0.9, 0.0, 0.7),
        (0, 0.95, 0.0, 1.3),
        (0, 1.0, 0.05, 1.0),
        (40, 0.8, 0.0, 1.0),
    ] {
        let params = SamplingParams {
            temperature: t,
            top_k: k,
            top_p: p,
            min_p,
            seed: 11,
            ..Default::default()
        };
        let (mut vector, mut scalar) =
            (Sampler::new(params.clone(), &[]), Sampler::new(params, &[]));
        let draws = 400;
        let (mut same, mut apart) = (0, 0);
        for _ in 0..draws {
            let (mut a, mut b) = (logits.clone(), logits.clone());
            a[7] = f32::NEG_INFINITY;
            b[7] = f32::NAN;
            let (ta, tb) = (vector.sample(&mut a), scalar.sample(&mut b));
            assert_ne!(ta, 7);
            same += usize::from(ta == tb);
            apart = apart.max(rank[ta as usize].abs_diff(rank[tb as usize]));
        }
        // Sums in another order may move a draw that falls within rounding of an edge.
        let what = format!("k {k}, p {p}, min_p {min_p}, t {t}: {same} of {draws} the same");
        assert!(apart <= 2, "{what}, {apart} ranks apart");
        assert!(same >= draws * 3 / 4, "{what}");
    }
}

/// Sampling from the whole distribution in vector passes, chunk by chunk, follows the softmax:
/// over 20,000 draws from 10,000 tokens (three chunks), each tenth of the probability mass (in id
/// order) gets a tenth of the draws.
#[test]
fn whole_distribution_draws_follow_the_softmax() {
    let vocab = 10_000;
    let logits: Vec<f32> = (0..vocab)
        .map(|i| ((i * 7919) % 1000) as f32 / 150.0)
        .collect();
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let weights: Vec<f64> = logits.iter().map(|&l| (l as f64 - max).exp()).collect();
    let total: f64 = weights.iter().sum();
    // decile[i]: the tenth of the mass token i's weight ends in.
    let mut acc = 0.0;
    let decile: Vec<usize> = weights
        .iter()
        .map(|w| {
            let d = ((acc + w / 2.0) / total * 10.0) as usize;
            acc += w;
            d.min(9)
        })
        .collect();
    let mut s = Sampler::new(
        SamplingParams {
            temperature: 1.0,
            seed: 21,
            ..Default::default()
        },
        &[],
    );
    let draws = 20_000;
    let mut counts = [0usize; 10];
    for _ in 0..draws {
        counts[decile[s.sample(&mut logits.clone()) as usize]] += 1;
    }
    for c in counts {
        let share = c as f64 / draws as f64;
        assert!((share - 0.1).abs() < 0.012, "{counts:?}");
    }
}

/// Greedy decoding with the vector pass picks the first of equal maxima, as the scalar one.
#[test]
fn argmax_takes_the_first_maximum() {
    let mut l = vec![0.5f32; 1000];
    l[400] = 3.0;
    l[700] = 3.0;
    assert_eq!(argmax(&l), 400);
    l[10] = f32::NAN;
    assert_eq!(argmax(&l), 400);
    assert_eq!(argmax(&[f32::NEG_INFINITY; 5]), 0);
    assert_eq!(argmax(&[]), 0);
}

/// Sampling at a temperature with nothing that changes the logits may be drawn elsewhere, its
/// cuts carried along, each draw with its own seed, the same for the same request seed.
#[test]
fn device_draws_are_temperature_sampling_with_a_seed_a_draw() {
    let plain = SamplingParams {
        temperature: 0.8,
        seed: 4,
        ..Default::default()
    };
    let mut s = Sampler::new(plain.clone(), &[1, 2]);
    let first = s.device_draw().unwrap();
    assert_eq!(first, DeviceDraw::plain(0.8, first.seed));
    assert_eq!(Sampler::new(plain.clone(), &[]).device_draw(), Some(first));
    // The draw after one not yet recorded is the one that follows its record.
    let ahead = s.device_draw_after(1);
    s.record(17);
    let second = s.device_draw().unwrap();
    assert_ne!(first.seed, second.seed);
    assert_eq!(ahead, Some(second));
    let cut = SamplingParams {
        top_k: 5,
        top_p: 0.9,
        min_p: 0.1,
        ..plain.clone()
    };
    let d = Sampler::new(cut, &[]).device_draw().unwrap();
    assert_eq!(
        (d.top_k, d.top_p, d.min_p, d.seed),
        (5, 0.9, 0.1, first.seed)
    );
    for p in [
        SamplingParams::default(),
        SamplingParams {
            repetition_penalty: 1.1,
            ..plain.clone()
        },
        SamplingParams {
            frequency_penalty: 0.5,
            ..plain.clone()
        },
        SamplingParams {
            presence_penalty: 0.5,
            ..plain.clone()
        },
        SamplingParams {
            logit_bias: vec![(3, 1.0)],
            ..plain.clone()
        },
    ] {
        assert_eq!(Sampler::new(p, &[]).device_draw(), None);
    }
}

/// Logits far apart at a tiny temperature (a penalty can make them so): the weights are taken
/// from differences, so the best token is drawn, not one of weight zero.
#[test]
fn huge_logit_gaps_at_tiny_temperatures_draw_the_best() {
    let tiny = |repetition_penalty| SamplingParams {
        temperature: 1e-5,
        repetition_penalty,
        seed: 2,
        ..Default::default()
    };
    let mut s = Sampler::new(tiny(1e-35), &[1]);
    assert_eq!(s.sample(&mut [0.5, 1.0, 0.25]), 1);
    let mut s = Sampler::new(tiny(1.0), &[]);
    assert_eq!(s.sample(&mut [0.0, 1e34]), 1);
    assert_eq!(s.sample(&mut [-1e34, -1e34 + 1e28]), 1);
}

/// The top-k heap, the cut among the tokens near the best and the full ranking keep the same
/// best token, near ties and signed zeros included.
#[test]
fn every_ranking_path_keeps_the_same_best() {
    for (logits, t) in [
        (vec![-0.0f32, 0.0], 1.0f32),
        (vec![0.0, -0.0], 1.0),
        (vec![1.5, 1.500_000_1], 1.25),
        (vec![3.0, 3.0, 2.0], 0.5),
        (vec![2.0, 7.0, 7.0, -1.0], 2.0),
    ] {
        let best = |top_k, top_p| {
            let mut s = Sampler::new(
                SamplingParams {
                    temperature: t,
                    top_k,
                    top_p,
                    seed: 1,
                    ..Default::default()
                },
                &[],
            );
            s.sample(&mut logits.clone())
        };
        let heap = best(1, 1.0);
        assert_eq!(best(0, 1e-6), heap, "{logits:?}: near the best");
        assert_eq!(best(5000, 1e-6), heap, "{logits:?}: full ranking");
    }
}

#[test]
fn argmax_skips_nan_wherever_it_sits() {
    let inf = f32::INFINITY;
    assert_eq!(argmax(&[f32::NAN, 1.0, 2.0]), 2);
    assert_eq!(argmax(&[f32::NAN, inf, 2.0]), 1);
    assert_eq!(argmax(&[1.0, f32::NAN, inf]), 2);
    assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
}

#[test]
fn choices_of_nearby_seeds_do_not_share_seeds() {
    let seeds: std::collections::HashSet<u64> = (40..50u64)
        .flat_map(|s| (0..16).map(move |i| choice_seed(s, i)))
        .collect();
    assert_eq!(seeds.len(), 10 * 16);
    assert_eq!(choice_seed(42, 0), 42);
}

/// With `min_tokens`, the end tokens are never drawn among the first draws, and no device may
/// pick until then (a device knows nothing of the ban).
#[test]
fn end_tokens_wait_for_min_tokens() {
    let logits = vec![0.0, 5.0, 1.0, 4.0];
    let mut s = Sampler::new(SamplingParams::default(), &[]).with_min_tokens(vec![1, 3], 2);
    assert!(!s.is_plain_greedy());
    assert_eq!(s.sample(&mut logits.clone()), 2);
    assert!(!s.is_plain_greedy());
    assert_eq!(s.sample(&mut logits.clone()), 2);
    assert!(s.is_plain_greedy());
    assert_eq!(s.sample(&mut logits.clone()), 1);
    // Drawing at a temperature: no device draw while the ban holds, counting tokens in flight.
    let warm = SamplingParams {
        temperature: 1.0,
        ..Default::default()
    };
    let mut s = Sampler::new(warm, &[]).with_min_tokens(vec![1], 2);
    assert!(s.device_draw().is_none());
    s.record(0);
    assert!(s.device_draw().is_none());
    assert!(s.device_draw_after(1).is_some());
    for seed in 0..50 {
        let mut s = Sampler::new(
            SamplingParams {
                temperature: 1.0,
                seed,
                ..Default::default()
            },
            &[],
        )
        .with_min_tokens(vec![1], 1);
        assert_ne!(s.sample(&mut [0.0, 9.0, 0.0]), 1);
    }
}

fn run_stream(stops: &[&str], keep: bool, unchecked: usize, pieces: &[&str]) -> (String, bool) {
    let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
    let mut st = StopStream::new(&stops).keeping_stop(keep);
    let mut seen = String::new();
    let mut hit = false;
    for (i, p) in pieces.iter().enumerate() {
        if i < unchecked {
            st.push_unchecked(p, &mut |t| seen.push_str(t));
        } else if st.push(p, &mut |t| seen.push_str(t)) {
            hit = true;
            break;
        }
    }
    if !hit {
        st.flush(&mut |t| seen.push_str(t));
    }
    assert_eq!(seen, st.text, "streamed and whole text differ");
    (seen, hit)
}

/// vLLM looks for a stop string in the new text and the `len - 1` characters before it, also
/// right after `min_tokens` (its window starts at the last unchecked token's end, less the
/// stop string's length): a stop string that begins in the last unchecked piece and ends in the
/// first checked one ends the text, and what it covers was never streamed.
#[test]
fn a_stop_string_across_the_min_tokens_boundary_is_found() {
    assert_eq!(
        run_stream(&["\n\n"], false, 1, &["a\n", "\nb", "c"]),
        ("a".to_string(), true)
    );
    // But one wholly inside the unchecked text is not (vLLM's window ends there).
    assert_eq!(
        run_stream(&["ab", "wxyz"], false, 1, &["ab", "c", "d"]),
        ("abcd".to_string(), false)
    );
}

/// The stop string that ends the text does not depend on how the text is split into tokens:
/// the one completed first, as vLLM picks (appending one token at a time).
#[test]
fn the_stop_found_does_not_depend_on_token_boundaries() {
    for keep in [true, false] {
        let whole = run_stream(&["\n", "\n\n"], keep, 0, &["a", "\n\nb"]);
        let split = run_stream(&["\n", "\n\n"], keep, 0, &["a", "\n", "\nb"]);
        assert_eq!(whole, split, "keep {keep}");
        let whole = run_stream(&["ABCD", "C"], keep, 0, &["xABCD"]);
        let split = run_stream(&["ABCD", "C"], keep, 0, &["x", "A", "B", "C", "D"]);
        assert_eq!(whole, split, "keep {keep}");
    }
}
