//! A tiny random Llama written by the test in both real formats — a Hugging Face folder
//! (config.json + safetensors) and a GGUF file (llama.cpp layout, Q/K permuted) — must give the
//! same logits; and dense attention must equal any flow whose budget covers the context.

use std::path::Path;

use rand::{Rng, SeedableRng, rngs::StdRng};
use vortex_flow::runner::FlowRunner;
use vortex_flow::{Geometry, Settings};
use vortex_kv::{KvCache, KvDtype, KvGeometry, Sequence};
use vortex_model::loader::{load, load_hf_folder};
use vortex_model::model::{KvState, Model, SeqStep};
use vortex_model::tokenizer::byte_to_char;

const VOCAB: usize = 256;
const HIDDEN: usize = 64;
const LAYERS: usize = 2;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 16;
const FFN: usize = 96;

struct Tensor {
    name: String,
    rows: usize,
    cols: usize,
    data: Vec<f32>,
}

fn random_model(seed: u64, arch: &str) -> Vec<Tensor> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut t = |name: &str, rows: usize, cols: usize, scale: f32, offset: f32| Tensor {
        name: name.to_string(),
        rows,
        cols,
        data: (0..rows * cols)
            .map(|_| offset + scale * (rng.random::<f32>() * 2.0 - 1.0))
            .collect(),
    };
    let mut v = vec![t("model.embed_tokens.weight", VOCAB, HIDDEN, 1.0, 0.0)];
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}.");
        v.push(t(
            &format!("{p}input_layernorm.weight"),
            1,
            HIDDEN,
            0.2,
            1.0,
        ));
        v.push(t(
            &format!("{p}self_attn.q_proj.weight"),
            HEADS * HEAD_DIM,
            HIDDEN,
            0.3,
            0.0,
        ));
        v.push(t(
            &format!("{p}self_attn.k_proj.weight"),
            KV_HEADS * HEAD_DIM,
            HIDDEN,
            0.3,
            0.0,
        ));
        v.push(t(
            &format!("{p}self_attn.v_proj.weight"),
            KV_HEADS * HEAD_DIM,
            HIDDEN,
            0.3,
            0.0,
        ));
        v.push(t(
            &format!("{p}self_attn.o_proj.weight"),
            HIDDEN,
            HEADS * HEAD_DIM,
            0.2,
            0.0,
        ));
        if arch == "qwen2" {
            v.push(t(
                &format!("{p}self_attn.q_proj.bias"),
                1,
                HEADS * HEAD_DIM,
                0.3,
                0.0,
            ));
            v.push(t(
                &format!("{p}self_attn.k_proj.bias"),
                1,
                KV_HEADS * HEAD_DIM,
                0.3,
                0.0,
            ));
            v.push(t(
                &format!("{p}self_attn.v_proj.bias"),
                1,
                KV_HEADS * HEAD_DIM,
                0.3,
                0.0,
            ));
        }
        if arch == "qwen3" {
            v.push(t(
                &format!("{p}self_attn.q_norm.weight"),
                1,
                HEAD_DIM,
                0.2,
                1.0,
            ));
            v.push(t(
                &format!("{p}self_attn.k_norm.weight"),
                1,
                HEAD_DIM,
                0.2,
                1.0,
            ));
        }
        v.push(t(
            &format!("{p}post_attention_layernorm.weight"),
            1,
            HIDDEN,
            0.2,
            1.0,
        ));
        v.push(t(
            &format!("{p}mlp.gate_proj.weight"),
            FFN,
            HIDDEN,
            0.2,
            0.0,
        ));
        v.push(t(&format!("{p}mlp.up_proj.weight"), FFN, HIDDEN, 0.2, 0.0));
        v.push(t(
            &format!("{p}mlp.down_proj.weight"),
            HIDDEN,
            FFN,
            0.2,
            0.0,
        ));
    }
    v.push(t("model.norm.weight", 1, HIDDEN, 0.2, 1.0));
    v.push(t("lm_head.weight", VOCAB, HIDDEN, 0.5, 0.0));
    v
}

fn write_hf(dir: &Path, tensors: &[Tensor], arch: &str) {
    std::fs::write(
        dir.join("config.json"),
        format!(
            r#"{{"model_type": "{arch}", "vocab_size": {VOCAB}, "hidden_size": {HIDDEN},
            "num_hidden_layers": {LAYERS}, "num_attention_heads": {HEADS},
            "num_key_value_heads": {KV_HEADS}, "intermediate_size": {FFN},
            "max_position_embeddings": 512, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": false}}"#
        ),
    )
    .unwrap();
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for t in tensors {
        let start = data.len();
        for x in &t.data {
            data.extend_from_slice(&x.to_le_bytes());
        }
        let shape = if t.rows == 1 {
            vec![t.cols]
        } else {
            vec![t.rows, t.cols]
        };
        header.insert(
            t.name.clone(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let h = serde_json::to_vec(&header).unwrap();
    let mut file = (h.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&h);
    file.extend_from_slice(&data);
    std::fs::write(dir.join("model.safetensors"), file).unwrap();
}

/// llama.cpp's permutation of Q/K rows for adjacent-pair rotation.
fn permute(t: &Tensor, heads: usize) -> Vec<f32> {
    let d = t.rows / heads;
    let mut out = vec![0.0; t.data.len()];
    for h in 0..heads {
        for i in 0..d / 2 {
            for j in 0..2 {
                let src = h * d + j * (d / 2) + i;
                let dst = h * d + 2 * i + j;
                out[dst * t.cols..(dst + 1) * t.cols]
                    .copy_from_slice(&t.data[src * t.cols..(src + 1) * t.cols]);
            }
        }
    }
    out
}

fn gguf_name(hf: &str) -> String {
    let map = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
    ];
    if let Some((_, g)) = map.iter().find(|(h, _)| *h == hf) {
        return g.to_string();
    }
    let rest = hf.strip_prefix("model.layers.").unwrap();
    let (l, role) = rest.split_once('.').unwrap();
    let g = match role {
        "input_layernorm.weight" => "attn_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.q_proj.bias" => "attn_q.bias",
        "self_attn.k_proj.bias" => "attn_k.bias",
        "self_attn.v_proj.bias" => "attn_v.bias",
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "post_attention_layernorm.weight" => "ffn_norm.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        _ => "ffn_down.weight",
    };
    format!("blk.{l}.{g}")
}

fn write_gguf(path: &Path, tensors: &[Tensor], arch: &str) {
    fn s(out: &mut Vec<u8>, x: &str) {
        out.extend_from_slice(&(x.len() as u64).to_le_bytes());
        out.extend_from_slice(x.as_bytes());
    }
    let mut kv: Vec<(String, Vec<u8>)> = Vec::new();
    let u32v = |v: u32| [4u32.to_le_bytes().to_vec(), v.to_le_bytes().to_vec()].concat();
    let f32v = |v: f32| [6u32.to_le_bytes().to_vec(), v.to_le_bytes().to_vec()].concat();
    let strv = |v: &str| {
        let mut o = 8u32.to_le_bytes().to_vec();
        s(&mut o, v);
        o
    };
    kv.push(("general.architecture".into(), strv(arch)));
    for (k, v) in [
        ("block_count", LAYERS),
        ("context_length", 512),
        ("embedding_length", HIDDEN),
        ("feed_forward_length", FFN),
        ("attention.head_count", HEADS),
        ("attention.head_count_kv", KV_HEADS),
    ] {
        kv.push((format!("{arch}.{k}"), u32v(v as u32)));
    }
    kv.push((format!("{arch}.rope.freq_base"), f32v(10000.0)));
    kv.push((
        format!("{arch}.attention.layer_norm_rms_epsilon"),
        f32v(1e-5),
    ));
    kv.push(("tokenizer.ggml.model".into(), strv("gpt2")));
    kv.push(("tokenizer.ggml.pre".into(), strv("qwen2")));
    let mut tokens = 9u32.to_le_bytes().to_vec();
    tokens.extend_from_slice(&8u32.to_le_bytes());
    tokens.extend_from_slice(&(VOCAB as u64).to_le_bytes());
    for b in 0..VOCAB {
        s(&mut tokens, &byte_to_char(b as u8).to_string());
    }
    kv.push(("tokenizer.ggml.tokens".into(), tokens));
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(kv.len() as u64).to_le_bytes());
    for (k, v) in &kv {
        s(&mut out, k);
        out.extend_from_slice(v);
    }
    let mut data = Vec::new();
    for t in tensors {
        let name = gguf_name(&t.name);
        // llama.cpp permutes Q/K only for the llama family.
        let values = if arch != "llama" {
            t.data.clone()
        } else if name.ends_with("attn_q.weight") {
            permute(t, HEADS)
        } else if name.ends_with("attn_k.weight") {
            permute(t, KV_HEADS)
        } else {
            t.data.clone()
        };
        while !data.len().is_multiple_of(32) {
            data.push(0);
        }
        s(&mut out, &name);
        let dims: Vec<u64> = if t.rows == 1 {
            vec![t.cols as u64]
        } else {
            vec![t.cols as u64, t.rows as u64]
        };
        out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(data.len() as u64).to_le_bytes());
        for x in values {
            data.extend_from_slice(&x.to_le_bytes());
        }
    }
    while !out.len().is_multiple_of(32) {
        out.push(0);
    }
    out.extend_from_slice(&data);
    std::fs::write(path, out).unwrap();
}

fn kv_state(model: &Model, flow: &str, page_size: usize) -> KvState {
    let c = &model.config;
    let g = Geometry {
        heads_q: c.heads_q,
        heads_kv: c.heads_kv,
        head_dim: c.head_dim,
        page_size,
    };
    let flow = vortex_flow::library::load(flow, g).unwrap();
    let geom = KvGeometry::new(c.heads_kv, c.head_dim, page_size).unwrap();
    KvState::new(
        KvCache::new(geom, KvDtype::F32, c.layers, 64),
        FlowRunner::new(flow),
    )
}

/// Logits after feeding `prompt` in chunks, then each of `decode` one at a time.
fn run(
    model: &Model,
    kv: &mut KvState,
    settings: &Settings,
    prompt: &[u32],
    chunk: usize,
    decode: &[u32],
) -> Vec<Vec<f32>> {
    let mut seq = Sequence::default();
    let mut state = kv.flow.new_state(model.config.layers);
    let mut out = Vec::new();
    for c in prompt.chunks(chunk) {
        let mut step = [SeqStep {
            seq: &mut seq,
            state: &mut state,
            settings,
            tokens: c,
        }];
        out = model.forward(kv, &mut step).unwrap();
    }
    let mut all = out;
    for t in decode {
        let mut step = [SeqStep {
            seq: &mut seq,
            state: &mut state,
            settings,
            tokens: std::slice::from_ref(t),
        }];
        all.extend(model.forward(kv, &mut step).unwrap());
    }
    kv.cache.free(&mut seq);
    all
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .fold(0.0, |m, (x, y)| m.max((x - y).abs()))
}

#[test]
fn hf_folder_and_gguf_give_the_same_logits() {
    for arch in ["llama", "qwen2", "qwen3"] {
        same_logits(arch);
    }
}

fn same_logits(arch: &str) {
    let dir = std::env::temp_dir().join(format!("vortex-tiny-{arch}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tensors = random_model(1, arch);
    write_hf(&dir, &tensors, arch);
    let gguf = dir.join("tiny.gguf");
    write_gguf(&gguf, &tensors, arch);
    let hf = load_hf_folder(&dir).unwrap();
    let gg = load(&gguf).unwrap();
    assert_eq!(gg.model.config.layers, LAYERS);
    let prompt: Vec<u32> = (0..40).map(|i| (i * 37 % 256) as u32).collect();
    let decode = [5u32, 77, 200];
    let settings = Settings {
        budget_ratio: Some(1.0),
        ..Settings::default()
    };
    let a = run(
        &hf,
        &mut kv_state(&hf, "dense", 16),
        &settings,
        &prompt,
        16,
        &decode,
    );
    let b = run(
        &gg.model,
        &mut kv_state(&gg.model, "dense", 16),
        &settings,
        &prompt,
        16,
        &decode,
    );
    let scale = a.iter().flatten().fold(0f32, |m, x| m.max(x.abs()));
    assert!(
        max_diff(&a, &b) <= 1e-4 * scale,
        "max diff {} (scale {scale})",
        max_diff(&a, &b)
    );
    // Chunking the prompt differently changes nothing but rounding.
    let c = run(
        &hf,
        &mut kv_state(&hf, "dense", 16),
        &settings,
        &prompt,
        7,
        &decode,
    );
    assert!(max_diff(&a, &c) <= 1e-4 * scale);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn full_budget_flows_equal_dense_exactly() {
    let dir = std::env::temp_dir().join(format!("vortex-tiny2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    write_hf(&dir, &random_model(2, "llama"), "llama");
    let model = load_hf_folder(&dir).unwrap();
    let prompt: Vec<u32> = (0..70).map(|i| (i * 11 % 256) as u32).collect();
    let decode: Vec<u32> = (0..20).map(|i| (i * 7 % 256) as u32).collect();
    let dense = Settings {
        budget_ratio: Some(1.0),
        ..Settings::default()
    };
    let want = run(
        &model,
        &mut kv_state(&model, "dense", 4),
        &dense,
        &prompt,
        32,
        &decode,
    );
    for flow in [
        "block_topk",
        "quest",
        "h2o",
        "streaming",
        "lsh",
        "double_sparse",
        "global_local",
    ] {
        let mut kv = kv_state(&model, flow, 4);
        let settings = Settings {
            budget: Some(1000),
            ..kv.flow.flow.settings.clone()
        };
        let got = run(&model, &mut kv, &settings, &prompt, 32, &decode);
        assert_eq!(
            got, want,
            "{flow} with a budget covering the context must equal dense"
        );
    }
    // A small budget really changes the attention (and so the logits).
    let mut kv = kv_state(&model, "block_topk", 4);
    let sparse = Settings {
        budget: Some(4),
        ..kv.flow.flow.settings.clone()
    };
    let got = run(&model, &mut kv, &sparse, &prompt, 32, &decode);
    assert_ne!(got, want);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn hf_folder_loads_with_its_tokenizer_and_generation_config() {
    let dir = std::env::temp_dir().join(format!("vortex-tiny3-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    write_hf(&dir, &random_model(3, "qwen2"), "qwen2");
    let vocab: serde_json::Map<String, serde_json::Value> = (0..VOCAB)
        .map(|b| (byte_to_char(b as u8).to_string(), serde_json::json!(b)))
        .collect();
    let tok = serde_json::json!({
        "version": "1.0",
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": vocab, "merges": []}
    });
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"eos_token_id": [5, 7]}"#,
    )
    .unwrap();
    let m = load(&dir).unwrap();
    assert_eq!(m.stop_tokens, vec![5, 7]);
    let ids = m.tokenizer.encode("hi!", false);
    assert_eq!(m.tokenizer.decode(&ids), "hi!");
    assert!(
        m.chat.is_chatml_fallback(),
        "no tokenizer_config.json: ChatML"
    );
    // A template in a file of its own, as newer transformers save it, comes first.
    let own = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}";
    std::fs::write(dir.join("chat_template.jinja"), own).unwrap();
    let m = load(&dir).unwrap();
    assert_eq!(m.chat.source(), own);
    std::fs::remove_dir_all(&dir).unwrap();
}
