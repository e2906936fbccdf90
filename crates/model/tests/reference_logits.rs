//! Logits of the real GGUF models against fixtures made with Hugging Face `transformers`
//! (scripts/reference_logits.py). Skips, saying so, where the model files are absent.
//!
//! Tolerance: the reference dequantizes the weights and computes in f32, while this runtime keeps
//! the weights quantized and quantizes activations to 8 bits for the integer dot products. That
//! moves logits by a fraction of their spread (simulating 8-bit activations in the reference
//! moved the top-64 logits by up to 0.25 of the logit std for SmolLM2, 0.07 for Qwen2.5), so we
//! allow 0.3 std on the reference's top-64 logits, and require the same top token wherever the
//! reference's top two are more than 0.3 std apart.

use std::path::PathBuf;

use serde_json::Value;
use vortex_flow::Geometry;
use vortex_flow::runner::FlowRunner;
use vortex_kv::{KvCache, KvDtype, KvGeometry, Sequence};
use vortex_model::gpu_values::fp8_model;
use vortex_model::loader::{LoadedModel, load};
use vortex_model::model::{KvState, SeqStep};
use vortex_model::sampling::argmax;

fn model_path(alias: &str) -> Option<PathBuf> {
    let file = match alias {
        "smollm2-135m" => "smollm2.gguf",
        "gemma3-270m" => "gemma3-270m.gguf",
        // A Hugging Face folder of the same weights in bf16 (made by scripts/gemma3_hf_folder.py).
        "gemma3-270m-hf" => "gemma3-270m-hf",
        _ => "qwen2.5-coder-0.5b.gguf",
    };
    let candidates = [
        std::env::var_os("VORTEX_TEST_MODELS").map(|d| PathBuf::from(d).join(file)),
        vortex_model::fetch::cached_path(alias).ok(),
        Some(PathBuf::from("/tmp/models").join(file)),
    ];
    candidates.into_iter().flatten().find(|p| p.exists())
}

/// A cache with room for 1,024 tokens.
fn kv(m: &LoadedModel, dtype: KvDtype) -> KvState {
    let c = &m.model.config;
    let g = Geometry {
        heads_q: c.heads_q,
        heads_kv: c.heads_kv,
        head_dim: c.head_dim,
        page_size: 16,
    };
    let flow = vortex_flow::library::load("dense", g).unwrap();
    let geom = KvGeometry::new(c.heads_kv, c.head_dim, 16).unwrap();
    KvState::new(
        KvCache::new(geom, dtype, c.layers, 64),
        FlowRunner::new(flow),
    )
}

/// `tol` is the allowed logit error in units of the reference's logit std.
fn check(alias: &str, dtype: KvDtype, tol: f32) {
    check_weights(alias, dtype, false, tol)
}

/// As `check`; with `fp8` the model's matrices are first replaced by their fp8 values.
fn check_weights(alias: &str, dtype: KvDtype, fp8: bool, tol: f32) {
    check_files(alias, alias, dtype, fp8, tol, None)
}

/// As `check_weights`, for the model at `alias`'s path against `fixture`'s reference, with its
/// sliding window set to `window` where given.
fn check_files(
    alias: &str,
    fixture: &str,
    dtype: KvDtype,
    fp8: bool,
    tol: f32,
    window: Option<usize>,
) {
    let Some(path) = model_path(alias) else {
        println!("SKIP: {alias} is not fetched (run `vortex model fetch {alias}`)");
        return;
    };
    let text = std::fs::read_to_string(format!(
        "{}/tests/fixtures/logits/{fixture}.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let fx: Value = serde_json::from_str(&text).unwrap();
    let mut m = load(&path).unwrap();
    if let (Some(w), Some(g)) = (window, m.model.config.gemma.as_mut()) {
        g.window = w;
    }
    if fp8 {
        m.model = fp8_model(&m.model);
    }
    let settings = vortex_flow::Settings {
        budget_ratio: Some(1.0),
        ..Default::default()
    };
    for prompt in fx["prompts"].as_array().unwrap() {
        let ids: Vec<u32> = prompt["input_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(
            m.tokenizer.encode(prompt["text"].as_str().unwrap(), true),
            ids,
            "tokenization"
        );
        let positions = prompt["positions"].as_array().unwrap();
        let first = positions[0]["position"].as_u64().unwrap() as usize;
        let mut kv = kv(&m, dtype);
        let mut seq = Sequence::default();
        let mut state = kv.flow.new_state(m.model.config.layers);
        // Prefill up to the first checked position, then one token at a time (decode path).
        let mut logits = Vec::new();
        let mut feed = vec![ids[..=first].to_vec()];
        feed.extend(ids[first + 1..].iter().map(|&t| vec![t]));
        for chunk in &feed {
            let mut step = [SeqStep {
                seq: &mut seq,
                state: &mut state,
                settings: &settings,
                tokens: chunk,
            }];
            logits.push(m.model.forward(&mut kv, &mut step).unwrap().pop().unwrap());
        }
        for (p, got) in positions.iter().zip(&logits) {
            let top: Vec<usize> = p["top_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect();
            let want: Vec<f32> = p["top_logits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect();
            let std = p["std"].as_f64().unwrap() as f32;
            let worst = top
                .iter()
                .zip(&want)
                .map(|(&i, &w)| (got[i] - w).abs())
                .fold(0.0, f32::max);
            println!(
                "{alias} ({dtype} KV, fp8 weights {fp8}) pos {}: worst top-64 logit diff {worst:.3} ({:.3} std)",
                p["position"],
                worst / std
            );
            assert!(
                worst <= tol * std,
                "{alias}: logits differ by {worst} (std {std})"
            );
            if want[0] - want[1] > tol * std {
                assert_eq!(argmax(got) as usize, top[0], "{alias}: top token");
            }
        }
    }
    let greedy = &fx["greedy"];
    let prompt: Vec<u32> = greedy["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let want: Vec<u32> = greedy["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let mut kv = kv(&m, dtype);
    let mut seq = Sequence::default();
    let mut state = kv.flow.new_state(m.model.config.layers);
    let mut tokens = prompt.clone();
    let mut out = Vec::new();
    let mut seen: Vec<Vec<f32>> = Vec::new();
    for _ in 0..want.len() {
        let feed = if out.is_empty() {
            tokens.clone()
        } else {
            vec![*tokens.last().unwrap()]
        };
        let mut step = [SeqStep {
            seq: &mut seq,
            state: &mut state,
            settings: &settings,
            tokens: &feed,
        }];
        let logits = m.model.forward(&mut kv, &mut step).unwrap().pop().unwrap();
        let next = argmax(&logits);
        out.push(next);
        tokens.push(next);
        seen.push(logits);
    }
    // The first tokens follow the reference, unless it parts from ours at a near tie: its
    // token must then score within the logit tolerance of ours.
    if let Some(k) = (0..4).find(|&k| out[k] != want[k]) {
        let l = &seen[k];
        let mean = l.iter().sum::<f32>() / l.len() as f32;
        let std = (l.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / l.len() as f32).sqrt();
        let gap = l[out[k] as usize] - l[want[k] as usize];
        println!(
            "{alias}: greedy token {k} is {} here, {} in the reference: {gap:.3} apart ({:.3} std)",
            out[k],
            want[k],
            gap / std
        );
        assert!(
            gap <= tol * std,
            "{alias}: greedy token {k}: {} against the reference's {} by {gap} (std {std})",
            out[k],
            want[k]
        );
    }
    if greedy["text"].as_str().unwrap().starts_with(" Paris") {
        assert!(m.tokenizer.decode(&out).starts_with(" Paris"));
    }
}

/// The products quantize their activations to 8 bits, so a last-bit difference upstream can move
/// an activation by a step, and the products' summation order shows at the fixture's
/// sensitive position 3: 0.17 of the logits' std with the AVX-512 kernels over rows in the
/// file's layout, 0.21 with the AVX2 ones, 0.22 with the scalar ones, 0.33 with the row groups
/// (0.23 with the groups' blocks summed in one chain instead of two); at the other positions
/// every path stays within 0.15.
#[test]
fn smollm2_matches_transformers() {
    check("smollm2-135m", KvDtype::F32, 0.4);
}

/// An fp8 cache (4 significant bits, no scale) moved SmolLM2's top-64 logits by up to 0.32 of
/// their std at the fixture's positions with the AVX-512 kernels (0.28 with f32), and by up to
/// 0.59 with the AVX2 ones: a K or V value that lands near a rounding boundary flips by a
/// sixteenth on a last-bit difference upstream, so the summation order shows. It kept the
/// greedy continuation either way.
#[test]
fn smollm2_matches_transformers_with_an_fp8_cache() {
    check("smollm2-135m", KvDtype::Fp8, 0.75);
}

/// Its third prompt is longer than the local layers' window of 512 tokens.
#[test]
fn gemma3_matches_transformers() {
    check("gemma3-270m", KvDtype::F32, 0.3);
}

/// The same weights from a Hugging Face folder (bf16 safetensors, `config.json` in
/// transformers 5's form, `tokenizer.json`): Gemma's norms stored as `w` of `1 + w`, its names.
#[test]
fn gemma3_from_a_hugging_face_folder_matches_transformers() {
    check_files(
        "gemma3-270m-hf",
        "gemma3-270m",
        KvDtype::F32,
        false,
        0.3,
        None,
    );
}

/// Against transformers with a window of 16 tokens, so that a window one token off shows. The
/// folder's weights (bf16, no activations quantized) follow the reference closely enough to
/// tell: 0.02 std here, where windows of 15 and 17 tokens moved logits by 0.2 std or more.
#[test]
fn gemma3_with_a_short_window_matches_transformers() {
    let (model, fixture) = ("gemma3-270m-hf", "gemma3-270m-window16");
    check_files(model, fixture, KvDtype::F32, false, 0.1, Some(16));
}

#[test]
fn qwen25_coder_matches_transformers() {
    check("qwen2.5-coder-0.5b", KvDtype::F32, 0.3);
}

/// `--weight-dtype fp8` on the GPU: every matrix in e4m3 with a scale a row, here the same values
/// widened to f32 on the CPU. Measured: SmolLM2's top-64 logits moved by up to 0.77 of their std
/// (0.17 with its own Q4_1 weights), Qwen2.5-Coder's by up to 0.28 (0.12 with its own); both
/// kept the greedy continuation.
#[test]
fn smollm2_with_fp8_weights_tracks_transformers() {
    check_weights("smollm2-135m", KvDtype::F32, true, 1.0);
}

#[test]
fn qwen25_coder_with_fp8_weights_tracks_transformers() {
    check_weights("qwen2.5-coder-0.5b", KvDtype::F32, true, 0.4);
}
