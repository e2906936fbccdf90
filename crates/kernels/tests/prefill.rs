use rand::{Rng, SeedableRng, rngs::StdRng};
use rayon::prelude::*;
use vortex_kernels::prefill::{prefill_attention, prefill_attention_with};
use vortex_kernels::simd::{Level, Simd};
use vortex_kv::{KvCache, KvDtype, KvGeometry, Sequence};

/// Causal attention in f64 from the values read back out of the cache.
fn reference(
    cache: &KvCache,
    seq: &Sequence,
    start: usize,
    q: &[f32],
    heads_q: usize,
    scale: f32,
) -> Vec<f32> {
    reference_in_window(cache, seq, start, q, heads_q, scale, usize::MAX)
}

/// [`reference`] where each query sees only the last `window` keys, its own included.
fn reference_in_window(
    cache: &KvCache,
    seq: &Sequence,
    start: usize,
    q: &[f32],
    heads_q: usize,
    scale: f32,
    window: usize,
) -> Vec<f32> {
    let g = cache.geometry();
    let (d, group) = (g.head_dim, heads_q / g.kv_heads);
    let layer = cache.layer(0);
    let key = |pos: usize, h: usize, v: bool| -> Vec<f32> {
        let page = seq.pages[pos / g.page_size];
        let mut out = vec![0.0; d];
        let st = if v { &layer.v } else { &layer.k };
        st.read_f32(
            layer.head_offset(page, h) + (pos % g.page_size) * d,
            &mut out,
        );
        out
    };
    let tokens = q.len() / (heads_q * d);
    let mut out = vec![0.0; q.len()];
    for t in 0..tokens {
        for j in 0..heads_q {
            let h = j / group;
            let qr = &q[(t * heads_q + j) * d..][..d];
            let first = (start + t + 1).saturating_sub(window);
            let scores: Vec<f64> = (first..=start + t)
                .map(|p| {
                    scale as f64
                        * key(p, h, false)
                            .iter()
                            .zip(qr)
                            .map(|(a, b)| (*a as f64) * (*b as f64))
                            .sum::<f64>()
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let z: f64 = w.iter().sum();
            for (p, wp) in (first..).zip(&w) {
                let vv = key(p, h, true);
                for c in 0..d {
                    out[(t * heads_q + j) * d + c] += (wp / z * vv[c] as f64) as f32;
                }
            }
        }
    }
    out
}

/// The f32 multiply-add rate of AVX-512 on every rayon thread at once, GFLOP/s (best of 3):
/// sixteen independent vector chains a thread.
fn fma_peak() -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        #[target_feature(enable = "avx512f")]
        fn chains(steps: usize) -> f32 {
            let mut acc = [_mm512_set1_ps(1.0); 16];
            let (a, b) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
            for _ in 0..steps {
                for x in acc.iter_mut() {
                    *x = _mm512_fmadd_ps(*x, a, b);
                }
            }
            _mm512_reduce_add_ps(
                acc.into_iter()
                    .fold(_mm512_setzero_ps(), |s, x| _mm512_add_ps(s, x)),
            )
        }
        Simd::with_level(Level::Avx512)?;
        let (threads, steps) = (rayon::current_num_threads(), 10_000_000);
        let best = (0..3)
            .map(|_| {
                let t = std::time::Instant::now();
                let sum: f32 = (0..threads)
                    .into_par_iter()
                    // SAFETY: AVX-512 F was detected above.
                    .map(|_| unsafe { chains(steps) })
                    .sum();
                std::hint::black_box(sum);
                t.elapsed().as_secs_f64()
            })
            .fold(f64::MAX, f64::min);
        Some((threads * steps * 16 * 16 * 2) as f64 / best / 1e9)
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// The largest absolute difference; infinite where `out` holds a value that is not finite
/// (which `f32::max` would pass over).
fn max_error(out: &[f32], want: &[f32]) -> f32 {
    out.iter().zip(want).fold(0f32, |a, (x, y)| {
        if x.is_finite() {
            a.max((x - y).abs())
        } else {
            f32::INFINITY
        }
    })
}

/// `n` values uniform in [-1, 1).
fn uniform(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect()
}

/// A one-layer cache of `dtype` holding a sequence of `tokens` random keys and values.
fn random_cache(
    rng: &mut StdRng,
    geom: KvGeometry,
    dtype: KvDtype,
    tokens: usize,
) -> (KvCache, Sequence) {
    let mut cache = KvCache::new(geom, dtype, 1, tokens.div_ceil(geom.page_size));
    let mut seq = Sequence::default();
    let width = geom.kv_heads * geom.head_dim;
    for slot in cache.append(&mut seq, tokens).unwrap() {
        let (k, v) = (uniform(rng, width), uniform(rng, width));
        cache
            .layer_mut(0)
            .write_token(slot.page, slot.offset, &k, &v)
            .unwrap();
    }
    (cache, seq)
}

/// The chunk's attention on every instruction set this CPU has (AVX-512 runs the tiled
/// products).
fn on_every_level(
    cache: &KvCache,
    seq: &Sequence,
    prior: usize,
    q: &[f32],
    heads_q: usize,
    scale: f32,
    window: Option<usize>,
) -> Vec<(Simd, Vec<f32>)> {
    [Level::Avx512, Level::Avx2, Level::Scalar]
        .into_iter()
        .filter_map(Simd::with_level)
        .map(|simd| {
            let mut out = vec![0.0; q.len()];
            prefill_attention_with(
                simd,
                window,
                cache.layer(0),
                &seq.pages,
                prior,
                q,
                heads_q,
                scale,
                &mut out,
            )
            .unwrap();
            (simd, out)
        })
        .collect()
}

/// Whether a bf16 or fp8 pool's prefill of `head_dim` runs the bf16 pair products here.
fn bf16_pairs(head_dim: usize) -> bool {
    vortex_kernels::simd::bf16_pairs() && head_dim.is_multiple_of(16)
}

/// A chunk of `tokens` random queries after `prior` random keys of a cache of `shape` (query
/// heads, KV heads, head_dim, page size, dtype), with a sliding `window` or none, on every level
/// against the f64 reference: a relative error below 1e-5, or 4e-3 on the bf16 pair products,
/// which round the queries and the weights to bf16 (2^-9 each).
fn check_chunk(
    rng: &mut StdRng,
    shape: (usize, usize, usize, usize, KvDtype),
    prior: usize,
    tokens: usize,
    window: Option<usize>,
) {
    let (heads_q, heads_kv, d, page, dtype) = shape;
    let geom = KvGeometry::new(heads_kv, d, page).unwrap();
    let (cache, seq) = random_cache(rng, geom, dtype, prior + tokens);
    let q = uniform(rng, tokens * heads_q * d);
    let scale = 1.0 / (d as f32).sqrt();
    let seen = window.unwrap_or(usize::MAX);
    let want = reference_in_window(&cache, &seq, prior, &q, heads_q, scale, seen);
    let max_ref = want.iter().fold(0f32, |a, b| a.max(b.abs()));
    for (simd, out) in on_every_level(&cache, &seq, prior, &q, heads_q, scale, window) {
        let err = max_error(&out, &want);
        let pairs = simd.level() == Level::Avx512
            && matches!(dtype, KvDtype::Bf16 | KvDtype::Fp8)
            && bf16_pairs(d);
        let tolerance = if pairs { 4e-3 } else { 1e-5 };
        assert!(
            err / max_ref < tolerance,
            "relative error {} for {shape:?}, {prior} + {tokens}, window {window:?} on {:?}",
            err / max_ref,
            simd.level()
        );
    }
}

#[test]
fn prefill_matches_causal_reference() {
    let mut rng = StdRng::seed_from_u64(3);
    for (heads_q, heads_kv, d, page, dtype, prior, tokens) in [
        (4, 1, 16, 16, KvDtype::F32, 0, 37),
        (8, 2, 32, 1, KvDtype::F32, 5, 20),
        (5, 5, 8, 64, KvDtype::Bf16, 70, 33),
        (9, 3, 64, 16, KvDtype::F16, 16, 17),
        (8, 2, 128, 16, KvDtype::Fp8, 20, 29),
        // Past one block of pages per softmax update, ending in a partial page.
        (4, 2, 16, 4, KvDtype::F32, 61, 40),
        (6, 2, 64, 16, KvDtype::Bf16, 250, 50),
        // One-token pages: many pages to a block of keys, past one block.
        (4, 1, 32, 1, KvDtype::Bf16, 290, 20),
        // Several blocks every row sees whole, then the diagonal.
        (8, 2, 128, 16, KvDtype::Bf16, 600, 40),
        (6, 2, 64, 8, KvDtype::Fp8, 530, 37),
    ] {
        let shape = (heads_q, heads_kv, d, page, dtype);
        check_chunk(&mut rng, shape, prior, tokens, None);
    }
}

#[test]
fn prefill_rejects_bad_shapes() {
    let geom = KvGeometry::new(2, 8, 16).unwrap();
    let mut cache = KvCache::new(geom, KvDtype::F32, 1, 4);
    let mut seq = Sequence::default();
    cache.append(&mut seq, 10).unwrap();
    let mut out = vec![0.0; 3 * 4 * 8];
    let q = vec![0.0; 3 * 4 * 8];
    assert!(prefill_attention(cache.layer(0), &seq.pages, 0, &q, 3, 1.0, &mut out[..72]).is_err());
    assert!(prefill_attention(cache.layer(0), &seq.pages, 20, &q, 4, 1.0, &mut out).is_err());
    assert!(prefill_attention(cache.layer(0), &seq.pages, 0, &q[..5], 4, 1.0, &mut out).is_err());
    // A page the pool does not have.
    let e = prefill_attention(cache.layer(0), &[9], 0, &q, 4, 1.0, &mut out).unwrap_err();
    assert!(e.to_string().contains("lists page 9"), "{e}");
}

/// `#[ignore]`d timing: one chunk of 512 new tokens after 7,680 cached ones (an 8K prompt's
/// last chunk), bf16 and fp8 KV, page 16, for SmolLM2-135M's attention (9 query heads over 3
/// KV heads, head_dim 64) and Qwen3's (32 over 8, head_dim 128; one layer).
/// `cargo test --release -p vortex-kernels --test prefill -- --ignored --nocapture`
#[test]
#[ignore]
fn prefill_speed() {
    let mut rng = StdRng::seed_from_u64(5);
    if let Some(peak) = fma_peak() {
        println!("f32 FMA peak on every thread: {peak:.1} GFLOP/s");
    }
    println!("| KV | heads q/kv | head_dim | cached | new | ms | GFLOP/s |");
    println!("|---|---|---|---|---|---|---|");
    let shapes = [(9, 3, 64), (32, 8, 128)];
    for (dtype, (heads_q, heads_kv, d)) in [KvDtype::Bf16, KvDtype::Fp8]
        .into_iter()
        .flat_map(|t| shapes.map(|s| (t, s)))
    {
        let (prior, tokens, page) = (7680, 512, 16);
        let geom = KvGeometry::new(heads_kv, d, page).unwrap();
        let (cache, seq) = random_cache(&mut rng, geom, dtype, prior + tokens);
        let q = uniform(&mut rng, tokens * heads_q * d);
        let mut out = vec![0.0; q.len()];
        let scale = 1.0 / (d as f32).sqrt();
        let mut times = Vec::new();
        for _ in 0..7 {
            let t = std::time::Instant::now();
            prefill_attention(
                cache.layer(0),
                &seq.pages,
                prior,
                &q,
                heads_q,
                scale,
                &mut out,
            )
            .unwrap();
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let s = times[times.len() / 2];
        // Two products of 2 * head_dim flops per (query head, key) pair in each row's past.
        let pairs: f64 = (0..tokens).map(|t| (prior + t + 1) as f64).sum();
        let flops = 4.0 * d as f64 * heads_q as f64 * pairs;
        println!(
            "| {} | {heads_q}/{heads_kv} | {d} | {prior} | {tokens} | {:.2} | {:.1} |",
            dtype.name(),
            s * 1e3,
            flops / s / 1e9
        );
    }
}

/// A first block of keys (16 one-token pages) whose every score is -inf weighs nothing on every
/// level.
#[test]
fn a_first_block_of_minus_infinite_scores_weighs_nothing() {
    let geom = KvGeometry::new(1, 1, 1).unwrap();
    let mut cache = KvCache::new(geom, KvDtype::F32, 1, 17);
    let mut seq = Sequence::default();
    cache.append(&mut seq, 17).unwrap();
    let layer = cache.layer_mut(0);
    for (i, &p) in seq.pages.iter().enumerate() {
        let at = layer.head_offset(p, 0);
        layer
            .k
            .write_f32(at, &[if i < 16 { f32::NEG_INFINITY } else { 1.0 }]);
        layer.v.write_f32(at, &[if i < 16 { 5.0 } else { 7.0 }]);
    }
    for level in [Level::Avx512, Level::Avx2, Level::Scalar] {
        let Some(simd) = Simd::with_level(level) else {
            continue;
        };
        let mut out = [0.0f32];
        prefill_attention_with(
            simd,
            None,
            cache.layer(0),
            &seq.pages,
            16,
            &[1.0],
            1,
            1.0,
            &mut out,
        )
        .unwrap();
        assert_eq!(out[0], 7.0, "{level:?}");
    }
}

/// A value that is not finite at a position reaches no row before it: the rows of a chunk that
/// cannot see a later token give the same output as if it were finite (rows of a prompt before
/// it are shared through the prefix cache).
#[test]
fn a_later_infinite_value_leaves_earlier_rows_alone() {
    let mut rng = StdRng::seed_from_u64(11);
    // Pages of 4 (the diagonal runs through pages) and of 16, one and several blocks of keys.
    for (page, prior, tokens, bad) in [(4, 0, 12, 9), (16, 3, 40, 30), (16, 300, 20, 310)] {
        let (heads_q, d) = (4, 16);
        let geom = KvGeometry::new(2, d, page).unwrap();
        let (mut cache, seq) = random_cache(&mut rng, geom, KvDtype::F32, prior + tokens);
        let q = uniform(&mut rng, tokens * heads_q * d);
        let want = reference(&cache, &seq, prior, &q, heads_q, 0.25);
        let layer = cache.layer_mut(0);
        for (h, x) in [(0, f32::INFINITY), (1, f32::NAN)] {
            let at = layer.head_offset(seq.pages[bad / page], h) + (bad % page) * d;
            layer.v.write_f32(at + 3, &[x]);
        }
        for (simd, out) in on_every_level(&cache, &seq, prior, &q, heads_q, 0.25, None) {
            let before = (bad - prior) * heads_q * d;
            for (i, (g, w)) in out[..before].iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-4,
                    "{:?} page {page}: row {} of {}: {g} against {w}",
                    simd.level(),
                    i / d,
                    before / d
                );
            }
        }
    }
}

/// The bf16 pair products at the edges of their shapes: one query of one head (15 padding
/// rows), one-token pages, head_dim 48, chunks ending in a partial block or an item of one
/// query, blocks that end exactly on the first row's position, wide groups.
#[test]
fn prefill_pairs_edges_match_causal_reference() {
    let mut rng = StdRng::seed_from_u64(11);
    for (heads_q, heads_kv, d, page, prior, tokens) in [
        (1, 1, 16, 1, 0, 1),
        (1, 1, 16, 16, 300, 1),
        (2, 2, 48, 1, 255, 33),
        (4, 1, 16, 2, 256, 1),
        (3, 1, 32, 4, 511, 65),
        (8, 1, 16, 16, 1000, 3),
        (2, 1, 48, 8, 224, 32),
        (2, 1, 48, 32, 225, 31),
        (6, 3, 32, 16, 257, 40),
        (4, 2, 16, 1, 767, 257),
    ] {
        let geom = KvGeometry::new(heads_kv, d, page).unwrap();
        let (cache, seq) = random_cache(&mut rng, geom, KvDtype::Bf16, prior + tokens);
        let q = uniform(&mut rng, tokens * heads_q * d);
        let scale = 1.0 / (d as f32).sqrt();
        let want = reference(&cache, &seq, prior, &q, heads_q, scale);
        let max_ref = want.iter().fold(0f32, |a, b| a.max(b.abs()));
        for (simd, out) in on_every_level(&cache, &seq, prior, &q, heads_q, scale, None) {
            let err = max_error(&out, &want);
            assert!(
                out.iter().all(|x| x.is_finite()) && err / max_ref < 4e-3,
                "relative error {} for {heads_q}/{heads_kv} d {d} page {page} prior {prior} \
                 tokens {tokens} on {:?}",
                err / max_ref,
                simd.level()
            );
        }
    }
}

/// A key and value no row before the last may see, not finite: every other row stays finite.
#[test]
fn prefill_pairs_never_let_a_masked_value_in() {
    let mut rng = StdRng::seed_from_u64(12);
    for (heads_q, heads_kv, d, page, prior, tokens) in [
        (2, 1, 16, 16, 300, 40),
        (2, 1, 32, 1, 0, 33),
        (4, 2, 16, 4, 255, 2),
    ] {
        let geom = KvGeometry::new(heads_kv, d, page).unwrap();
        let (mut cache, seq) = random_cache(&mut rng, geom, KvDtype::Bf16, prior + tokens);
        let last = prior + tokens - 1;
        let bad = vec![f32::NAN; heads_kv * d];
        cache
            .layer_mut(0)
            .write_token(seq.pages[last / page], last % page, &bad, &bad)
            .unwrap();
        let q = uniform(&mut rng, tokens * heads_q * d);
        for (simd, out) in on_every_level(&cache, &seq, prior, &q, heads_q, 0.25, None) {
            let before = &out[..(tokens - 1) * heads_q * d];
            assert!(
                before.iter().all(|x| x.is_finite()),
                "a masked value leaked for {heads_q}/{heads_kv} d {d} page {page} on {:?}",
                simd.level()
            );
        }
    }
}

/// A sliding-window layer's queries see only the last `window` keys: windows within a page, across
/// blocks of keys, wider than the context, of one key; rows whose windows start in different
/// blocks; blocks every row sees whole (the bf16 pairs) between partial ones.
#[test]
fn windowed_prefill_matches_reference() {
    let mut rng = StdRng::seed_from_u64(8);
    for (heads_q, heads_kv, d, page, dtype, prior, tokens, window) in [
        (4, 1, 16, 16, KvDtype::F32, 0, 37, 5),
        (4, 2, 16, 4, KvDtype::F32, 61, 40, 23),
        (8, 2, 32, 1, KvDtype::F32, 300, 20, 280),
        (5, 5, 8, 64, KvDtype::Bf16, 70, 33, 1000),
        (4, 1, 256, 16, KvDtype::Bf16, 540, 30, 512),
        (6, 2, 64, 16, KvDtype::Bf16, 900, 70, 600),
        (8, 2, 128, 16, KvDtype::Fp8, 530, 37, 300),
        (4, 1, 64, 16, KvDtype::Bf16, 1000, 1, 512),
        (4, 1, 16, 16, KvDtype::F16, 20, 9, 1),
    ] {
        let shape = (heads_q, heads_kv, d, page, dtype);
        check_chunk(&mut rng, shape, prior, tokens, Some(window));
    }
}

/// Keys and values that are not finite before a row's window reach none of its output, on every
/// path: the bf16 pairs too, which must leave blocks some rows see only in part to the f32 tiles.
#[test]
fn keys_before_the_window_reach_nothing() {
    let mut rng = StdRng::seed_from_u64(12);
    let cases = [
        (4, 40, 12, 8, 30, KvDtype::F32),
        (16, 600, 20, 300, 290, KvDtype::F32),
        (16, 600, 40, 221, 314, KvDtype::Bf16),
        (16, 600, 40, 221, 314, KvDtype::Fp8),
        (8, 1000, 70, 500, 460, KvDtype::Bf16),
    ];
    for (page, prior, tokens, window, bad, dtype) in cases {
        let (heads_q, d) = (4, 64);
        let geom = KvGeometry::new(2, d, page).unwrap();
        let (mut cache, seq) = random_cache(&mut rng, geom, dtype, prior + tokens);
        let q = uniform(&mut rng, tokens * heads_q * d);
        let want = reference_in_window(&cache, &seq, prior, &q, heads_q, 0.125, window);
        let max_ref = want.iter().fold(0f32, |a, b| a.max(b.abs()));
        // Every row's window starts past `bad`.
        assert!(prior + 1 > bad + window);
        let layer = cache.layer_mut(0);
        for (h, x) in [(0, f32::INFINITY), (1, f32::NAN)] {
            let at = layer.head_offset(seq.pages[bad / page], h) + (bad % page) * d;
            layer.k.write_f32(at, &[x]);
            layer.v.write_f32(at + 3, &[x]);
        }
        let levels = on_every_level(&cache, &seq, prior, &q, heads_q, 0.125, Some(window));
        for (simd, out) in levels {
            let err = max_error(&out, &want);
            let pairs = simd.level() == Level::Avx512 && dtype != KvDtype::F32 && bf16_pairs(d);
            let tolerance = if pairs { 4e-3 } else { 1e-5 };
            assert!(
                err / max_ref < tolerance,
                "relative error {} on {:?}, {dtype:?}, page {page}",
                err / max_ref,
                simd.level()
            );
        }
    }
}

/// A query's output is the same to the bit however its prompt was cut into chunks (a server
/// cuts prompts by what else shares the step), on every path, with and without a window: items
/// and blocks of keys are counted from the sequence's start, and which blocks take the bf16
/// pairs depends on a query's position alone. The whole prompt in one chunk, cut once at
/// positions around the blocks of 256 keys, and the last queries one at a time.
#[test]
fn a_row_is_the_same_however_the_prompt_is_cut() {
    let mut rng = StdRng::seed_from_u64(21);
    let (heads_q, d, total) = (6, 32, 333);
    for (dtype, page, window) in [
        (KvDtype::Bf16, 16, None),
        (KvDtype::Bf16, 8, Some(100)),
        (KvDtype::Fp8, 16, Some(300)),
        (KvDtype::F32, 16, None),
        (KvDtype::F32, 4, Some(130)),
    ] {
        let geom = KvGeometry::new(2, d, page).unwrap();
        let (cache, seq) = random_cache(&mut rng, geom, dtype, total);
        let q = uniform(&mut rng, total * heads_q * d);
        let width = heads_q * d;
        for simd in [Level::Avx512, Level::Avx2, Level::Scalar]
            .into_iter()
            .filter_map(Simd::with_level)
        {
            let rows = |from: usize, to: usize| {
                let mut out = vec![0.0; (to - from) * width];
                let q = &q[from * width..to * width];
                let layer = cache.layer(0);
                prefill_attention_with(
                    simd, window, layer, &seq.pages, from, q, heads_q, 0.125, &mut out,
                )
                .unwrap();
                out
            };
            let whole = rows(0, total);
            let cut_at = |cuts: &[usize]| -> Vec<f32> {
                let mut ends = cuts.to_vec();
                ends.push(total);
                let mut from = 0;
                let mut out = Vec::new();
                for to in ends {
                    out.extend(rows(from, to));
                    from = to;
                }
                out
            };
            let mut ways = vec![vec![2], vec![37], vec![255], vec![256, 300], vec![100, 331]];
            ways.push((300..total).collect());
            for cuts in ways {
                let out = cut_at(&cuts);
                let first_off = whole
                    .chunks(width)
                    .zip(out.chunks(width))
                    .position(|(a, b)| a != b);
                assert_eq!(
                    first_off,
                    None,
                    "{dtype:?}, window {window:?}, {:?}: row differs when cut at {cuts:?}",
                    simd.level()
                );
            }
        }
    }
}
