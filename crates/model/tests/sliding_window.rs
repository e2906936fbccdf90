//! Gemma 3's layout on random weights: sliding-window layers give the same logits however the
//! tokens arrive (one prefill, chunks, one decode step at a time), a local layer's output
//! depends only on the tokens in its window, and local layers keep no page summaries.

mod logits_support;

use logits_support::kv_state;
use vortex_kv::{KvDtype, Sequence};
use vortex_model::config::{Arch, Gemma3, ModelConfig};
use vortex_model::model::{ForwardError, KvState, Model, SeqStep};
use vortex_model::random::{random_weights, tiny_config};

fn gemma(layers: usize, window: usize, global_every: usize) -> Model {
    let config = ModelConfig {
        arch: Arch::Gemma3,
        layers,
        gemma: Some(Gemma3 {
            window,
            global_every,
            local_rope_theta: 100.0,
            query_scalar: 24.0,
        }),
        ..tiny_config()
    };
    config.validate().unwrap();
    random_weights(config, 7)
}

/// The logits after each chunk of `chunks`, fed in order to a fresh sequence.
fn logits(model: &Model, chunks: &[&[u32]]) -> Vec<Vec<f32>> {
    logits_support::logits(model, chunks, KvDtype::F32)
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0.0, |m, (x, y)| m.max((x - y).abs()))
}

fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + seed * 11) % 250 + 3)
        .collect()
}

#[test]
fn prefill_chunks_and_decode_steps_agree() {
    let model = gemma(4, 6, 2);
    let tokens = prompt(41, 1);
    let whole = logits(&model, &[&tokens]).pop().unwrap();
    let chunked: Vec<&[u32]> = tokens.chunks(7).collect();
    let by_chunks = logits(&model, &chunked).pop().unwrap();
    let mut stepwise = vec![&tokens[..10]];
    stepwise.extend(tokens[10..].chunks(1));
    let by_steps = logits(&model, &stepwise).pop().unwrap();
    let scale = whole.iter().fold(0f32, |m, x| m.max(x.abs()));
    assert!(max_diff(&whole, &by_chunks) < 1e-4 * scale);
    assert!(max_diff(&whole, &by_steps) < 1e-4 * scale);
    // The window is not the whole context: a wider one gives other logits.
    let wide = logits(&gemma(4, 64, 2), &[&tokens]).pop().unwrap();
    assert!(max_diff(&whole, &wide) > 1e-2 * scale);
}

/// One local layer of window 5: the last token's logits depend only on the last five tokens,
/// in prefill and in decode.
#[test]
fn a_local_layer_sees_only_its_window() {
    let model = gemma(1, 5, 1000);
    let (a, mut b) = (prompt(30, 1), prompt(30, 2));
    b[25..].copy_from_slice(&a[25..]);
    assert_ne!(a[..25], b[..25]);
    let prefilled = [&a, &b].map(|t| logits(&model, &[t]).pop().unwrap());
    assert!(max_diff(&prefilled[0], &prefilled[1]) < 1e-5);
    let decoded = [&a, &b].map(|t| {
        logits(&model, &[&t[..20], &t[20..29], &t[29..]])
            .pop()
            .unwrap()
    });
    assert!(max_diff(&decoded[0], &decoded[1]) < 1e-5);
    // With one more token of difference inside the window, they part.
    b[25] = a[25] + 1;
    let other = logits(&model, &[&b]).pop().unwrap();
    assert!(max_diff(&prefilled[0], &other) > 1e-4);
}

/// Logits of `model` after a 41-token prompt and six decode steps through block_topk keeping 4
/// of the pages of 4 tokens, on `kv`.
fn block_topk_logits(model: &Model, kv: &mut KvState) -> Result<Vec<Vec<f32>>, ForwardError> {
    let mut settings = kv.flow.flow.settings.clone();
    settings.budget = Some(4);
    settings.budget_ratio = None;
    settings.min_context = 0;
    let mut seq = Sequence::default();
    let mut state = kv.flow.new_state(model.config.layers);
    let tokens = prompt(47, 3);
    let chunks = std::iter::once(&tokens[..41]).chain(tokens[41..].chunks(1));
    let mut out = Vec::new();
    for tokens in chunks {
        let mut step = [SeqStep {
            seq: &mut seq,
            state: &mut state,
            settings: &settings,
            tokens,
        }];
        out.push(model.forward(kv, &mut step)?.remove(0));
    }
    Ok(out)
}

/// A KV state made for the model keeps no summaries in its sliding-window layers, which never
/// select pages, and decodes as one that keeps them in every layer; used for a model whose
/// layers all select, or of more layers, it is an error, not a panic.
#[test]
fn sliding_window_layers_keep_no_summaries() {
    let model = gemma(4, 6, 2);
    let (mut every, mut selecting) = (
        kv_state(&model, "block_topk", KvDtype::Bf16, false),
        kv_state(&model, "block_topk", KvDtype::Bf16, true),
    );
    let global = model.config.flow_layers().len();
    assert!(global > 0 && global < model.config.layers);
    assert_eq!(
        selecting.summary_bytes() * model.config.layers,
        every.summary_bytes() * global
    );
    let want = block_topk_logits(&model, &mut every).unwrap();
    assert_eq!(block_topk_logits(&model, &mut selecting).unwrap(), want);

    let all_global = random_weights(
        ModelConfig {
            layers: 4,
            ..tiny_config()
        },
        7,
    );
    let mut kv = kv_state(&model, "block_topk", KvDtype::Bf16, true);
    match block_topk_logits(&all_global, &mut kv) {
        Err(ForwardError::Backend(e)) => assert!(e.contains("keeps no summaries"), "{e}"),
        other => panic!("expected an error, got {other:?}"),
    }
    // A cache of fewer layers than the model's.
    let mut kv = kv_state(&gemma(2, 6, 2), "block_topk", KvDtype::Bf16, true);
    match block_topk_logits(&model, &mut kv) {
        Err(ForwardError::Backend(e)) => assert!(e.contains("has 2 layers, the model 4"), "{e}"),
        other => panic!("expected an error, got {other:?}"),
    }
}
