//! SentencePiece BPE on a small vocabulary built here: merges by score, the leftmost first among
//! equal scores, byte fallback, spaces as `▁`, and what merges may not produce.

use vortex_model::tokenizer::{BpeConfig, Tokenizer, TokenizerError};

const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const BYTE: i32 = 6;

/// 256 byte tokens, then `pieces` as (text, score, type).
fn tokenizer(pieces: &[(&str, f32, i32)], add_space_prefix: bool) -> Tokenizer {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| format!("<0x{b:02X}>")).collect();
    let mut scores = vec![0.0; 256];
    let mut types = vec![BYTE; 256];
    for &(t, s, ty) in pieces {
        tokens.push(t.to_string());
        scores.push(s);
        types.push(ty);
    }
    let cfg = BpeConfig::spm_from_gguf(tokens, scores, &types, add_space_prefix).unwrap();
    Tokenizer::from_bpe(cfg).unwrap()
}

fn pieces(t: &Tokenizer, text: &str) -> Vec<String> {
    t.encode_with(text, false, false)
        .iter()
        .map(|&i| t.id_to_token(i).unwrap().to_string())
        .collect()
}

const CHARS: [(&str, f32, i32); 4] = [
    ("a", -10.0, NORMAL),
    ("b", -10.0, NORMAL),
    ("c", -10.0, NORMAL),
    ("\u{2581}", -10.0, NORMAL),
];

#[test]
fn the_higher_score_merges_first() {
    let ab_first = tokenizer(
        &[
            CHARS.as_slice(),
            &[("ab", -1.0, NORMAL), ("bc", -2.0, NORMAL)],
        ]
        .concat(),
        false,
    );
    assert_eq!(pieces(&ab_first, "abc"), ["ab", "c"]);
    let bc_first = tokenizer(
        &[
            CHARS.as_slice(),
            &[("ab", -2.0, NORMAL), ("bc", -1.0, NORMAL)],
        ]
        .concat(),
        false,
    );
    assert_eq!(pieces(&bc_first, "abc"), ["a", "bc"]);
    // A merge of merges, however low its score, once its parts exist.
    let whole = tokenizer(
        &[
            CHARS.as_slice(),
            &[("ab", -1.0, NORMAL), ("abc", -9.0, NORMAL)],
        ]
        .concat(),
        false,
    );
    assert_eq!(pieces(&whole, "abcab"), ["abc", "ab"]);
}

#[test]
fn equal_scores_merge_the_leftmost_pair() {
    let t = tokenizer(
        &[
            CHARS.as_slice(),
            &[("ab", -1.0, NORMAL), ("ba", -1.0, NORMAL)],
        ]
        .concat(),
        false,
    );
    assert_eq!(pieces(&t, "aba"), ["ab", "a"]);
    assert_eq!(pieces(&t, "bab"), ["ba", "b"]);
}

#[test]
fn spaces_become_the_visible_space_and_decode_back() {
    let t = tokenizer(
        &[CHARS.as_slice(), &[("\u{2581}a", -1.0, NORMAL)]].concat(),
        false,
    );
    assert_eq!(pieces(&t, "a a"), ["a", "\u{2581}a"]);
    assert_eq!(t.decode(&t.encode("a a", false)), "a a");
    let prefixed = tokenizer(
        &[CHARS.as_slice(), &[("\u{2581}a", -1.0, NORMAL)]].concat(),
        true,
    );
    assert_eq!(pieces(&prefixed, "a"), ["\u{2581}a"]);
}

#[test]
fn characters_without_a_token_fall_back_to_bytes() {
    let t = tokenizer(&CHARS, false);
    assert_eq!(pieces(&t, "aé"), ["a", "<0xC3>", "<0xA9>"]);
    assert_eq!(t.decode(&t.encode("aé🦀", false)), "aé🦀");
}

#[test]
fn merges_never_produce_control_tokens() {
    let t = tokenizer(&[CHARS.as_slice(), &[("ab", 0.0, CONTROL)]].concat(), false);
    assert_eq!(pieces(&t, "ab"), ["a", "b"]);
    // Written in the text, a control token is its id only where special tokens are parsed.
    assert_eq!(t.encode_with("ab", false, true).len(), 1);
}

#[test]
fn scores_must_match_the_tokens() {
    let cfg =
        BpeConfig::spm_from_gguf(vec!["a".into(), "b".into()], vec![0.0], &[], false).unwrap();
    assert_eq!(
        Tokenizer::from_bpe(cfg).unwrap_err(),
        TokenizerError::ScoresLength {
            tokens: 2,
            scores: 1
        }
    );
}

/// A `tokenizer.json` of SentencePiece's BPE as transformers writes it: the merges' order stands
/// for the scores, unknown characters fall back to bytes, spaces become `▁` in the normalizer.
fn tokenizer_json(normalizer: &str, pre_tokenizer: &str) -> String {
    let mut vocab: Vec<String> = vec!["<unk>".into(), "<bos>".into()];
    vocab.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    vocab.extend(["a", "b", "c", "\u{2581}", "ab", "bc", "\u{2581}a", "abc"].map(String::from));
    let vocab: serde_json::Map<String, serde_json::Value> = vocab
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i.into()))
        .collect();
    serde_json::json!({
        "added_tokens": [{"id": 1, "content": "<bos>", "special": true}],
        "normalizer": serde_json::from_str::<serde_json::Value>(normalizer).unwrap(),
        "pre_tokenizer": serde_json::from_str::<serde_json::Value>(pre_tokenizer).unwrap(),
        "post_processor": null,
        "decoder": null,
        "model": {
            "type": "BPE", "byte_fallback": true, "unk_token": "<unk>", "vocab": vocab,
            "merges": [["b", "c"], ["a", "b"], ["\u{2581}", "a"], ["a", "bc"], ["ab", "c"]]
        }
    })
    .to_string()
}

const REPLACE: &str = r#"{"type": "Replace", "pattern": {"String": " "}, "content": "▁"}"#;

#[test]
fn a_tokenizer_json_with_byte_fallback_merges_in_its_order() {
    let t = Tokenizer::from_hf_json(&tokenizer_json(REPLACE, "null")).unwrap();
    // "bc" is the first merge: "abc" goes a + bc, then abc.
    assert_eq!(pieces(&t, "abc"), ["abc"]);
    assert_eq!(pieces(&t, "ab"), ["ab"]);
    assert_eq!(pieces(&t, "cab a"), ["c", "ab", "\u{2581}a"]);
    assert_eq!(pieces(&t, "aé"), ["a", "<0xC3>", "<0xA9>"]);
    assert_eq!(t.decode(&t.encode("cab aé", false)), "cab aé");
    // A split at spaces after the normalizer replaced them is accepted: it splits nothing.
    let split = r#"{"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": false}"#;
    let t = Tokenizer::from_hf_json(&tokenizer_json(REPLACE, split)).unwrap();
    assert_eq!(pieces(&t, "cab a"), ["c", "ab", "\u{2581}a"]);
    let prepend = format!(
        r#"{{"type": "Sequence", "normalizers": [{{"type": "Prepend", "prepend": "▁"}}, {REPLACE}]}}"#
    );
    let t = Tokenizer::from_hf_json(&tokenizer_json(&prepend, "null")).unwrap();
    assert_eq!(pieces(&t, "a"), ["\u{2581}a"]);
}

/// Merges apply pair by pair in their order, as Hugging Face's BPE applies them, even where a
/// vocabulary token could be joined from another pair sooner: "abcd" is a + bcd, not abc + d.
#[test]
fn a_tokenizer_json_merges_pairs_not_tokens() {
    let vocab: serde_json::Map<String, serde_json::Value> =
        ["<unk>", "a", "b", "c", "d", "bc", "abc", "bcd", "ab"]
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), i.into()))
            .collect();
    let json = serde_json::json!({
        "normalizer": serde_json::from_str::<serde_json::Value>(REPLACE).unwrap(),
        "model": {
            "type": "BPE", "byte_fallback": true, "unk_token": "<unk>", "vocab": vocab,
            "merges": [["b", "c"], ["ab", "c"], ["bc", "d"], ["a", "bc"], ["a", "b"]]
        }
    });
    let t = Tokenizer::from_hf_json(&json.to_string()).unwrap();
    assert_eq!(pieces(&t, "abcd"), ["a", "bcd"]);
}

#[test]
fn other_sentencepiece_pipelines_are_refused() {
    for (normalizer, pre) in [
        (r#"{"type": "NFKC"}"#, "null"),
        ("null", "null"),
        (REPLACE, r#"{"type": "Metaspace", "replacement": "▁"}"#),
    ] {
        let e = Tokenizer::from_hf_json(&tokenizer_json(normalizer, pre)).unwrap_err();
        assert!(
            matches!(
                e,
                TokenizerError::Unsupported(_) | TokenizerError::UnsupportedPreTokenizer(_)
            ),
            "{e}"
        );
    }
}

const CONTROL_TOKEN: [(&str, f32, i32); 1] = [("</s>", 0.0, CONTROL)];

/// Where the vocabulary puts a space before text, it goes at the start and after each special
/// token (as llama.cpp does), not before text that continues text encoded earlier: a chat
/// message that spells a control token, encoded in parts, keeps its spaces.
#[test]
fn a_space_goes_before_text_once() {
    let t = tokenizer(&[CHARS.as_slice(), &CONTROL_TOKEN].concat(), true);
    let specials: Vec<String> = t
        .encode_with("a</s>b", false, true)
        .iter()
        .map(|&i| t.id_to_token(i).unwrap().to_string())
        .collect();
    assert_eq!(specials, ["\u{2581}", "a", "</s>", "\u{2581}", "b"]);
    assert_eq!(t.decode(&t.encode_continuing("a b", false)), "a b");
    let template = vortex_model::chat::ChatTemplate::new(
        "{% for m in messages %}{{ m['content'] }}{% endfor %}",
        "",
        "</s>",
    )
    .unwrap();
    let message = [vortex_model::chat::ChatMessage::user("a</s>b c")];
    let ids = vortex_model::chat_prompt::chat_prompt(&template, &t, &message).unwrap();
    assert_eq!(t.decode(&ids), " a</s>b c");
    assert!(!ids.contains(&t.token_to_id("</s>").unwrap()));
}
