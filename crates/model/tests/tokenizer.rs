//! Tokenizer tests.
//!
//! Always on: a small synthetic byte-level BPE vocabulary built here (merges and their ranks,
//! byte fallback of unknown characters, special and added tokens, streaming decode, errors,
//! `tokenizer.json` parsing, speed).
//!
//! With the real models present (see `real_file`), the ids for ~35 strings are compared with
//! the Hugging Face `tokenizers` reference ids in `tests/fixtures/tokenizer/*.json`, made by
//! `scripts/make_tokenizer_fixtures.py`. The vocabularies are read at test time from the GGUF
//! files (a minimal GGUF metadata reader is below) and from Qwen3's `tokenizer.json`; when a file
//! is absent the test prints a SKIP line and passes.

use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::time::Instant;

use vortex_model::tokenizer::{
    BpeConfig, HfTokenizerConfig, PreTokenizer, StreamDecoder, TokenType, Tokenizer,
    TokenizerError, to_byte_level,
};

// ---------------------------------------------------------------------------------------------
// Synthetic vocabulary

/// 256 byte tokens (ids 0..256 in byte order), then merged tokens, then special tokens.
fn synthetic_config() -> BpeConfig {
    let mut tokens: Vec<String> = (0..=255u8)
        .map(|b| vortex_model::tokenizer::byte_to_char(b).to_string())
        .collect();
    let merges: Vec<String> = [
        "h e",
        "l l",
        "he ll",
        "hell o",
        "Ġ w",
        "o r",
        "Ġw or",
        "l d",
        "Ġwor ld",
        "a b",
        "b c",
        "a a",
        "Ġ Ġ",
        "ĠĠ ĠĠ",
        "1 2",
        "Ġ t",
        "Ġt he",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for m in &merges {
        let joined = m.replace(' ', "");
        if !tokens.contains(&joined) {
            tokens.push(joined);
        }
    }
    let mut types = vec![TokenType::Normal; tokens.len()];
    for (t, ty) in [
        ("<|endoftext|>", TokenType::Control),
        ("<|im_start|>", TokenType::Control),
        ("<|im_end|>", TokenType::Control),
        ("<tool>", TokenType::UserDefined),
        ("<|im_start|>x", TokenType::Control), // longer overlapping special: leftmost-longest
    ] {
        tokens.push(t.to_string());
        types.push(ty);
    }
    let id = |s: &str| tokens.iter().position(|t| t == s).unwrap() as u32;
    BpeConfig {
        bos_id: Some(id("<|im_start|>")),
        eos_id: Some(id("<|im_end|>")),
        pad_id: Some(id("<|endoftext|>")),
        token_types: types,
        ..BpeConfig::new(tokens, merges, PreTokenizer::Gpt2)
    }
}

fn synthetic() -> Tokenizer {
    Tokenizer::from_bpe(synthetic_config()).expect("synthetic vocabulary is valid")
}

fn id(t: &Tokenizer, s: &str) -> u32 {
    t.token_to_id(s)
        .unwrap_or_else(|| panic!("{s:?} not in vocabulary"))
}

fn byte(b: u8) -> u32 {
    b as u32 // byte tokens are ids 0..256 in the synthetic vocabulary
}

#[test]
fn merges_by_rank() {
    let t = synthetic();
    assert_eq!(t.encode("hello", false), [id(&t, "hello")]);
    assert_eq!(
        t.encode("hello world", false),
        [id(&t, "hello"), id(&t, "Ġworld")]
    );
    // "a b" outranks "b c": abc -> ab c
    assert_eq!(t.encode("abc", false), [id(&t, "ab"), byte(b'c')]);
    // equal pairs merge leftmost first: aaa -> aa a
    assert_eq!(t.encode("aaa", false), [id(&t, "aa"), byte(b'a')]);
    // "Ġt he" is not reachable from "Ġthe" split as Ġt+h+e? it is: Ġ t -> Ġt, h e -> he, Ġt he.
    assert_eq!(t.encode(" the", false), [id(&t, "Ġthe")]);
    // Unmerged letters stay bytes.
    assert_eq!(t.encode("xyz", false), [byte(b'x'), byte(b'y'), byte(b'z')]);
}

#[test]
fn rank_order_matters() {
    let mut cfg = synthetic_config();
    // Put "b c" before "a b": abc -> a bc
    let ab = cfg.merges.iter().position(|m| m == "a b").unwrap();
    let bc = cfg.merges.iter().position(|m| m == "b c").unwrap();
    cfg.merges.swap(ab, bc);
    let t = Tokenizer::from_bpe(cfg).unwrap();
    assert_eq!(t.encode("abc", false), [byte(b'a'), id(&t, "bc")]);
}

#[test]
fn unknown_characters_fall_back_to_bytes() {
    let t = synthetic();
    // é is C3 A9; 🦀 is F0 9F A6 80: no merges, so one token per byte.
    assert_eq!(t.encode("é", false), [byte(0xC3), byte(0xA9)]);
    let crab = t.encode("🦀", false);
    assert_eq!(crab, [byte(0xF0), byte(0x9F), byte(0xA6), byte(0x80)]);
    assert_eq!(t.decode(&crab), "🦀");
    let text = "naïve 中文 🦀 ok\n\t";
    assert_eq!(t.decode(&t.encode(text, false)), text);
}

#[test]
fn whitespace_runs_follow_gpt2_lookahead() {
    let t = synthetic();
    // "a   b": the run gives its last space to the word: "a", "ĠĠ", "Ġb"
    let ids = t.encode("a   b", false);
    assert_eq!(ids, [byte(b'a'), id(&t, "ĠĠ"), byte(b' '), byte(b'b')]);
    assert_eq!(t.decode(&ids), "a   b");
}

#[test]
fn special_tokens_are_matched_verbatim() {
    let t = synthetic();
    let (s, e) = (id(&t, "<|im_start|>"), id(&t, "<|im_end|>"));
    let ids = t.encode("<|im_start|>hello<|im_end|>", false);
    assert_eq!(ids, [s, id(&t, "hello"), e]);
    // Leftmost-longest: "<|im_start|>x" is its own special token.
    assert_eq!(t.encode("<|im_start|>x", false), [id(&t, "<|im_start|>x")]);
    // Unfinished specials are plain text.
    let partial = t.encode("<|im_end|", false);
    assert!(!partial.contains(&e));
    assert_eq!(t.decode(&partial), "<|im_end|");
    // Adjacent specials.
    assert_eq!(t.encode("<|im_end|><|im_end|>", false), [e, e]);
    // Without parse_special, control tokens are text but user-defined ones still match.
    let plain = t.encode_with("<|im_end|><tool>", false, false);
    assert!(!plain.contains(&e));
    assert_eq!(*plain.last().unwrap(), id(&t, "<tool>"));
    assert_eq!(t.decode(&plain), "<|im_end|><tool>");
    // Decoding: specials verbatim, or skipped.
    assert_eq!(t.decode(&ids), "<|im_start|>hello<|im_end|>");
    assert_eq!(t.decode_with(&ids, true), "hello");
    assert!(t.is_special(e) && !t.is_special(id(&t, "<tool>")));
    assert!(t.is_eog(e) && t.is_eog(id(&t, "<|endoftext|>")));
    assert!(!t.is_eog(s));
}

#[test]
fn bos_and_eos_follow_the_config() {
    let t = synthetic();
    assert_eq!(t.encode("hello", true), [id(&t, "hello")]); // add_bos off
    let mut cfg = synthetic_config();
    cfg.add_bos = true;
    cfg.add_eos = true;
    let t = Tokenizer::from_bpe(cfg).unwrap();
    let (s, e) = (id(&t, "<|im_start|>"), id(&t, "<|im_end|>"));
    assert_eq!(t.encode("hello", true), [s, id(&t, "hello"), e]);
    assert_eq!(t.encode("hello", false), [id(&t, "hello")]);
    assert_eq!(t.encode("", true), [s, e]);
}

#[test]
fn decode_is_lossy_and_skips_unknown_ids() {
    let t = synthetic();
    assert_eq!(t.decode(&[byte(0xE4), byte(b'a')]), "\u{FFFD}a");
    assert_eq!(t.decode(&[byte(b'a'), 9_999_999, byte(b'b')]), "ab");
    assert_eq!(t.decode(&[]), "");
}

#[test]
fn stream_decoder_holds_back_partial_characters() {
    let t = synthetic();
    let mut d = StreamDecoder::new(false);
    let ids = t.encode("a🦀é", false);
    let outs: Vec<String> = ids.iter().map(|&i| d.push(&t, i)).collect();
    assert_eq!(outs, ["a", "", "", "", "🦀", "", "é"]);
    assert_eq!(d.finish(), "");
    // An incomplete tail is flushed as one U+FFFD, like decode().
    let mut d = t.stream_decoder(false);
    assert_eq!(d.push(&t, byte(0xE4)), "");
    assert_eq!(d.push(&t, byte(0xB8)), "");
    assert_eq!(d.pending_bytes(), [0xE4, 0xB8]);
    assert_eq!(d.finish(), "\u{FFFD}");
    // A sequence broken by another token becomes U+FFFD, then the rest continues.
    let mut d = t.stream_decoder(false);
    assert_eq!(d.push(&t, byte(0xE4)), "");
    assert_eq!(d.push(&t, byte(b'x')), "\u{FFFD}x");
    // Special tokens can be skipped.
    let mut d = t.stream_decoder(true);
    assert_eq!(d.push(&t, id(&t, "<|im_end|>")), "");
    assert_eq!(d.push(&t, id(&t, "hello")), "hello");
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config {
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    })]

    #[test]
    fn stream_equals_decode(ids in proptest::collection::vec(0u32..270, 0..40), skip in proptest::bool::ANY) {
        let t = synthetic();
        let mut d = StreamDecoder::new(skip);
        let mut s = String::new();
        for &i in &ids {
            s.push_str(&d.push(&t, i));
        }
        s.push_str(&d.finish());
        proptest::prop_assert_eq!(s, t.decode_with(&ids, skip));
    }

    #[test]
    fn roundtrip_any_text(text in "\\PC{0,40}") {
        let t = synthetic();
        // No specials in random text except by chance; decode(encode(x)) == x always holds.
        proptest::prop_assert_eq!(t.decode(&t.encode(&text, false)), text);
    }
}

#[test]
fn malformed_vocab_and_merges_are_errors() {
    let base = synthetic_config;
    let mut c = base();
    c.merges.push("nospace".into());
    assert!(matches!(
        Tokenizer::from_bpe(c),
        Err(TokenizerError::BadMerge { reason, .. }) if reason.contains("space")
    ));
    let mut c = base();
    c.merges.push("zz q".into());
    assert!(matches!(
        Tokenizer::from_bpe(c),
        Err(TokenizerError::BadMerge { reason, .. }) if reason.contains("left")
    ));
    let mut c = base();
    c.merges.push("x y".into()); // "xy" is not a token
    let e = Tokenizer::from_bpe(c).unwrap_err();
    assert!(
        e.to_string().contains("merged token not in vocabulary"),
        "{e}"
    );
    let mut c = base();
    c.token_types.pop();
    assert!(matches!(
        Tokenizer::from_bpe(c),
        Err(TokenizerError::TokenTypesLength { .. })
    ));
    let mut c = base();
    c.eos_id = Some(1_000_000);
    assert!(matches!(
        Tokenizer::from_bpe(c),
        Err(TokenizerError::IdOutOfRange { what: "eos", .. })
    ));
    assert_eq!(
        Tokenizer::from_bpe(BpeConfig::default()).unwrap_err(),
        TokenizerError::EmptyVocab
    );
    let mut c = base();
    c.pre = Some(PreTokenizer::Steps(vec![
        vortex_model::tokenizer::PreTokStep::Regex("(unclosed".into()),
    ]));
    assert!(matches!(
        Tokenizer::from_bpe(c),
        Err(TokenizerError::BadRegex { .. })
    ));
    // GGUF-shaped input.
    assert!(matches!(
        BpeConfig::from_gguf("llama", None, vec!["a".into()], vec![], &[]),
        Err(TokenizerError::UnsupportedModel(_))
    ));
    let e =
        BpeConfig::from_gguf("gpt2", Some("mystery"), vec!["a".into()], vec![], &[]).unwrap_err();
    assert!(
        e.to_string().contains("mystery") && e.to_string().contains("qwen2"),
        "{e}"
    );
    assert!(matches!(
        BpeConfig::from_gguf("gpt2", Some("qwen2"), vec!["a".into()], vec![], &[9]),
        Err(TokenizerError::BadTokenType { id: 0, code: 9 })
    ));
    let ok = BpeConfig::from_gguf("gpt2", Some("qwen2"), vec!["a".into()], vec![], &[1]).unwrap();
    assert!(ok.nfc && ok.pre == Some(PreTokenizer::Qwen2));
}

/// A byte without a token of its own becomes the BPE model's unknown token when it has one (a
/// `tokenizer.json`'s `model.unk_token`), and is dropped otherwise, as in llama.cpp: a GGUF's
/// unknown token id may be an end-of-text token.
#[test]
fn byte_tokens_missing_from_vocab_map_to_unk_or_are_dropped() {
    let tokens: Vec<String> = vec!["<unk>".into(), "a".into(), "b".into(), "ab".into()];
    let cfg = |byte_unk_id| BpeConfig {
        unk_id: Some(0),
        byte_unk_id,
        token_types: vec![
            TokenType::Unknown,
            TokenType::Normal,
            TokenType::Normal,
            TokenType::Normal,
        ],
        ..BpeConfig::new(tokens.clone(), vec!["a b".into()], PreTokenizer::Gpt2)
    };
    let t = Tokenizer::from_bpe(cfg(Some(0))).unwrap();
    assert_eq!(t.encode("abc", false), [3, 0]);
    let t = Tokenizer::from_bpe(cfg(None)).unwrap();
    assert_eq!(t.encode("abc", false), [3]);
    assert_eq!(
        t.encode("acb", false),
        [3],
        "the dropped byte no longer parts a and b"
    );
}

// ---------------------------------------------------------------------------------------------
// tokenizer.json

fn synthetic_tokenizer_json(merges_as_pairs: bool) -> String {
    let cfg = synthetic_config();
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (i, (t, ty)) in cfg.tokens.iter().zip(&cfg.token_types).enumerate() {
        match ty {
            TokenType::Normal => {
                vocab.insert(t.clone(), i.into());
            }
            _ => added.push(serde_json::json!({
                "id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": *ty == TokenType::Control
            })),
        }
    }
    let merges: Vec<serde_json::Value> = cfg
        .merges
        .iter()
        .map(|m| {
            if merges_as_pairs {
                let (a, b) = m.split_once(' ').unwrap();
                serde_json::json!([a, b])
            } else {
                serde_json::json!(m)
            }
        })
        .collect();
    serde_json::json!({
        "version": "1.0",
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false,
                  "vocab": vocab, "merges": merges}
    })
    .to_string()
}

#[test]
fn tokenizer_json_matches_direct_construction() {
    let direct = synthetic();
    for pairs in [false, true] {
        let t = Tokenizer::from_hf_json(&synthetic_tokenizer_json(pairs)).unwrap();
        assert_eq!(t.vocab_size(), direct.vocab_size());
        assert_eq!(t.pre_tokenizer(), &PreTokenizer::Gpt2);
        for text in [
            "hello world",
            "<|im_start|>abc<|im_end|>",
            "a   b\n\n",
            "🦀 <tool>",
        ] {
            assert_eq!(t.encode(text, true), direct.encode(text, true), "{text:?}");
        }
        assert_eq!(t.token_type(id(&t, "<tool>")), Some(TokenType::UserDefined));
        assert_eq!(t.token_type(id(&t, "<|im_end|>")), Some(TokenType::Control));
    }
    // tokenizer_config.json supplies bos/eos/add_bos.
    let cfg = HfTokenizerConfig::parse(
        r#"{"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}, "add_bos_token": true,
            "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}"#,
    )
    .unwrap();
    assert_eq!(cfg.chat_template.as_deref(), Some("D"));
    let t = Tokenizer::from_hf_json_with_config(&synthetic_tokenizer_json(false), &cfg).unwrap();
    assert_eq!(t.bos_id(), Some(id(&t, "<|im_start|>")));
    assert_eq!(t.eos_id(), Some(id(&t, "<|im_end|>")));
    assert_eq!(t.encode("hello", true)[0], id(&t, "<|im_start|>"));
}

#[test]
fn tokenizer_json_errors() {
    let bad = |json: &str| Tokenizer::from_hf_json(json).unwrap_err();
    assert!(matches!(bad("{"), TokenizerError::Json(_)));
    assert!(matches!(bad("{}"), TokenizerError::Json(_)));
    assert!(matches!(
        bad(r#"{"model": {"type": "WordPiece", "vocab": {}}}"#),
        TokenizerError::UnsupportedModel(_)
    ));
    let base: serde_json::Value = serde_json::from_str(&synthetic_tokenizer_json(false)).unwrap();
    let with = |ptr: &str, v: serde_json::Value| {
        let mut j = base.clone();
        *j.pointer_mut(ptr).unwrap() = v;
        Tokenizer::from_hf_json(&j.to_string()).unwrap_err()
    };
    // Byte fallback makes it SentencePiece's BPE, whose normalizer must write spaces as `▁`.
    assert!(matches!(
        with("/model/byte_fallback", true.into()),
        TokenizerError::Unsupported(_)
    ));
    assert!(matches!(
        with("/decoder", serde_json::json!({"type": "Metaspace"})),
        TokenizerError::Unsupported(_)
    ));
    assert!(matches!(
        with("/normalizer", serde_json::json!({"type": "Lowercase"})),
        TokenizerError::Unsupported(_)
    ));
    assert!(matches!(
        with("/model/merges", serde_json::json!([1, 2])),
        TokenizerError::Json(_)
    ));
    assert!(matches!(
        with("/model/merges", serde_json::json!(["q zz"])),
        TokenizerError::BadMerge { .. }
    ));
    assert!(matches!(
        with("/model/vocab/a", serde_json::json!(-1)),
        TokenizerError::Json(_)
    ));
    // One id far past the others would size every id table by it.
    let e = with("/model/vocab/a", serde_json::json!(16_000_000));
    assert!(e.to_string().contains("about contiguous"), "{e}");
    let e = Tokenizer::from_hf_file("/nonexistent/tokenizer.json").unwrap_err();
    assert!(matches!(e, TokenizerError::Io { .. }), "{e}");
}

// ---------------------------------------------------------------------------------------------
// Speed

/// Text with mostly distinct words (so the piece cache rarely helps): random letter runs in
/// several scripts, numbers, punctuation, code-like lines and whitespace runs.
fn long_text(words: usize) -> String {
    const LATIN: &[char] = &[
        'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'k', 'l', 'm', 'n', 'o', 'p', 'r', 's', 't',
        'u', 'w', 'y', 'é', 'ß', 'ü',
    ];
    const CJK: &[char] = &[
        '的', '一', '是', '不', '了', '人', '我', '在', '有', '他', '这', '中', '大', '来',
    ];
    const PUNCT: &[&str] = &[
        ", ", ". ", "!\n", "();\n", " = ", " {\n    ", "}\n", "\n\n", "\t", "  ", " 🦀 ", "->",
        "\"", "'s ",
    ];
    let mut s = String::new();
    let mut state = 0x2545F4914F6CDD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..words {
        let r = next();
        match r % 10 {
            0 => s.push_str(&(next() % 100_000).to_string()),
            1 => {
                for _ in 0..1 + next() % 4 {
                    s.push(CJK[(next() % CJK.len() as u64) as usize]);
                }
            }
            2 => s.push_str(PUNCT[(next() % PUNCT.len() as u64) as usize]),
            _ => {
                if r % 7 == 0 {
                    s.push(' ');
                }
                for i in 0..2 + next() % 8 {
                    let c = LATIN[(next() % LATIN.len() as u64) as usize];
                    if i == 0 && r % 5 == 0 {
                        s.extend(c.to_uppercase());
                    } else {
                        s.push(c);
                    }
                }
            }
        }
        s.push(' ');
    }
    s
}

#[test]
fn encodes_32k_tokens_quickly_synthetic() {
    speed_check(&synthetic(), "synthetic");
}

// ---------------------------------------------------------------------------------------------
// Real models

/// A minimal GGUF metadata reader: just enough for `tokenizer.*` keys.
mod gguf_meta {
    use super::*;

    #[derive(Debug, Clone)]
    #[allow(dead_code)] // F's payload is never read
    pub enum V {
        U(u64),
        I(i64),
        F(f64),
        B(bool),
        S(String),
        A(Vec<V>),
    }

    impl V {
        pub fn str(&self) -> Option<&str> {
            if let V::S(s) = self { Some(s) } else { None }
        }
        pub fn u32(&self) -> Option<u32> {
            match self {
                V::U(u) => u32::try_from(*u).ok(),
                V::I(i) => u32::try_from(*i).ok(),
                _ => None,
            }
        }
        pub fn strings(&self) -> Option<Vec<String>> {
            if let V::A(a) = self {
                a.iter().map(|v| v.str().map(String::from)).collect()
            } else {
                None
            }
        }
        pub fn ints(&self) -> Option<Vec<i32>> {
            if let V::A(a) = self {
                a.iter()
                    .map(|v| match v {
                        V::I(i) => i32::try_from(*i).ok(),
                        V::U(u) => i32::try_from(*u).ok(),
                        _ => None,
                    })
                    .collect()
            } else {
                None
            }
        }
    }

    fn rd<const N: usize>(r: &mut impl Read) -> std::io::Result<[u8; N]> {
        let mut b = [0u8; N];
        r.read_exact(&mut b)?;
        Ok(b)
    }

    fn string(r: &mut impl Read) -> std::io::Result<String> {
        let n = u64::from_le_bytes(rd(r)?) as usize;
        let mut b = vec![0u8; n];
        r.read_exact(&mut b)?;
        String::from_utf8(b).map_err(|e| std::io::Error::other(e.to_string()))
    }

    fn value(r: &mut impl Read, ty: u32) -> std::io::Result<V> {
        Ok(match ty {
            0 => V::U(u8::from_le_bytes(rd(r)?) as u64),
            1 => V::I(i8::from_le_bytes(rd(r)?) as i64),
            2 => V::U(u16::from_le_bytes(rd(r)?) as u64),
            3 => V::I(i16::from_le_bytes(rd(r)?) as i64),
            4 => V::U(u32::from_le_bytes(rd(r)?) as u64),
            5 => V::I(i32::from_le_bytes(rd(r)?) as i64),
            6 => V::F(f32::from_le_bytes(rd(r)?) as f64),
            7 => V::B(rd::<1>(r)?[0] != 0),
            8 => V::S(string(r)?),
            9 => {
                let ety = u32::from_le_bytes(rd(r)?);
                let n = u64::from_le_bytes(rd(r)?) as usize;
                let mut a = Vec::with_capacity(n.min(1 << 20));
                for _ in 0..n {
                    a.push(value(r, ety)?);
                }
                V::A(a)
            }
            10 => V::U(u64::from_le_bytes(rd(r)?)),
            11 => V::I(i64::from_le_bytes(rd(r)?)),
            12 => V::F(f64::from_le_bytes(rd(r)?)),
            t => return Err(std::io::Error::other(format!("bad GGUF type {t}"))),
        })
    }

    /// All metadata key/values of a GGUF v2/v3 file.
    pub fn read(path: &Path) -> std::io::Result<HashMap<String, V>> {
        let mut r = BufReader::with_capacity(1 << 20, std::fs::File::open(path)?);
        if &rd::<4>(&mut r)? != b"GGUF" {
            return Err(std::io::Error::other("not a GGUF file"));
        }
        let _version = u32::from_le_bytes(rd(&mut r)?);
        let _tensors = u64::from_le_bytes(rd(&mut r)?);
        let kvs = u64::from_le_bytes(rd(&mut r)?);
        let mut out = HashMap::new();
        for _ in 0..kvs {
            let k = string(&mut r)?;
            let ty = u32::from_le_bytes(rd(&mut r)?);
            out.insert(k, value(&mut r, ty)?);
        }
        Ok(out)
    }
}

/// The tokenizer of a GGUF file, built from its `tokenizer.ggml.*` metadata.
fn gguf_tokenizer(path: &Path) -> Tokenizer {
    let m = gguf_meta::read(path).expect("read GGUF metadata");
    let s = |k: &str| m.get(k).and_then(|v| v.str().map(String::from));
    let u = |k: &str| m.get(k).and_then(gguf_meta::V::u32);
    let b = |k: &str| matches!(m.get(k), Some(gguf_meta::V::B(true)));
    let mut cfg = BpeConfig::from_gguf(
        &s("tokenizer.ggml.model").unwrap(),
        s("tokenizer.ggml.pre").as_deref(),
        m["tokenizer.ggml.tokens"].strings().unwrap(),
        m["tokenizer.ggml.merges"].strings().unwrap(),
        &m["tokenizer.ggml.token_type"].ints().unwrap(),
    )
    .unwrap();
    cfg.bos_id = u("tokenizer.ggml.bos_token_id");
    cfg.eos_id = u("tokenizer.ggml.eos_token_id");
    cfg.pad_id = u("tokenizer.ggml.padding_token_id");
    cfg.unk_id = u("tokenizer.ggml.unknown_token_id");
    cfg.add_bos = b("tokenizer.ggml.add_bos_token");
    cfg.add_eos = b("tokenizer.ggml.add_eos_token");
    Tokenizer::from_bpe(cfg).unwrap()
}

/// First existing file among `$env_var`, `/tmp/models/<names>`, and the fetch cache entry.
fn real_file(env_var: &str, names: &[&str], alias: Option<&str>) -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = std::env::var_os(env_var)
        .map(PathBuf::from)
        .into_iter()
        .collect();
    candidates.extend(names.iter().map(|n| Path::new("/tmp/models").join(n)));
    if let Some(a) = alias
        && let Ok(p) = vortex_model::fetch::cached_path(a)
    {
        candidates.push(p);
    }
    let found = candidates.into_iter().find(|p| p.is_file());
    if found.is_none() {
        println!(
            "SKIP: no {} (set {env_var}, put it in /tmp/models, or `fetch` it)",
            names.first().unwrap_or(&"file")
        );
    }
    found
}

#[derive(serde::Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
    decoded: String,
}

#[derive(serde::Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

fn fixture(name: &str) -> Fixture {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tokenizer")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

fn check_against_fixture(t: &Tokenizer, name: &str, skip_texts: &[&str]) {
    let fx = fixture(name);
    let mut failures = Vec::new();
    for c in &fx.cases {
        if skip_texts.iter().any(|s| c.text.contains(s)) {
            continue;
        }
        let got = t.encode(&c.text, true);
        if got != c.ids {
            let show = |ids: &[u32]| {
                ids.iter()
                    .map(|&i| t.id_to_token(i).unwrap_or("?").to_string())
                    .collect::<Vec<_>>()
            };
            failures.push(format!(
                "{:?}\n   got {got:?} {:?}\n  want {:?} {:?}",
                c.text,
                show(&got),
                c.ids,
                show(&c.ids)
            ));
        }
        assert_eq!(t.decode(&c.ids), c.decoded, "decode of {:?}", c.text);
        let mut d = StreamDecoder::new(false);
        let streamed: String =
            c.ids.iter().map(|&i| d.push(t, i)).collect::<String>() + &d.finish();
        assert_eq!(streamed, c.decoded, "stream decode of {:?}", c.text);
    }
    assert!(
        failures.is_empty(),
        "{name}: {} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    println!("{name}: {} cases match the reference", fx.cases.len());
}

/// Encoding >= 32K tokens of varied text must take well under a second (cold cache).
fn speed_check(t: &Tokenizer, label: &str) {
    let text = long_text(16_000);
    let start = Instant::now();
    let ids = t.encode(&text, false);
    let el = start.elapsed();
    println!(
        "{label}: {} tokens from {} bytes in {el:?} (cold cache)",
        ids.len(),
        text.len()
    );
    assert!(ids.len() >= 32_000, "{}", ids.len());
    assert!(el.as_secs_f64() < 1.0, "{label}: {el:?}");
    let start = Instant::now();
    let decoded = t.decode(&ids);
    println!("{label}: decoded in {:?}", start.elapsed());
    assert_eq!(decoded, text);
}

#[test]
fn smollm2_matches_reference() {
    let Some(p) = real_file(
        "VORTEX_SMOLLM2_GGUF",
        &["smollm2.gguf", "smollm2-135m.gguf"],
        Some("smollm2-135m"),
    ) else {
        return;
    };
    let t = gguf_tokenizer(&p);
    assert_eq!(t.vocab_size(), 49152);
    assert_eq!(t.pre_tokenizer(), &PreTokenizer::SmolLm);
    assert_eq!(t.eos_id(), Some(2));
    assert!(t.is_eog(0) && t.is_eog(2));
    check_against_fixture(&t, "smollm2.json", &[]);
    speed_check(&t, "smollm2");
}

#[test]
fn qwen25_matches_reference() {
    let Some(p) = real_file(
        "VORTEX_QWEN25_GGUF",
        &["qwen2.5-coder-0.5b.gguf", "qwen2.5.gguf"],
        Some("qwen2.5-coder-0.5b"),
    ) else {
        return;
    };
    let t = gguf_tokenizer(&p);
    assert_eq!(t.vocab_size(), 151936);
    assert_eq!(t.pre_tokenizer(), &PreTokenizer::Qwen2);
    check_against_fixture(&t, "qwen2.5.json", &[]);
    // Not a token in Qwen2.5: <think> is plain text there.
    assert!(t.token_to_id("<think>").is_none());
    speed_check(&t, "qwen2.5");
}

/// Gemma 3's SentencePiece vocabulary, against the `sentencepiece` library's own encoding.
#[test]
fn gemma3_matches_reference() {
    let Some(p) = real_file(
        "VORTEX_GEMMA3_GGUF",
        &["gemma3-270m.gguf", "gemma3.gguf"],
        Some("gemma3-270m"),
    ) else {
        return;
    };
    let f = vortex_model::gguf::GgufFile::open(&p).unwrap();
    let t = vortex_model::gguf_model::gguf_tokenizer(&f).unwrap();
    assert_eq!(t.vocab_size(), 262144);
    assert_eq!((t.bos_id(), t.eos_id()), (Some(2), Some(1)));
    assert!(t.is_eog(t.token_to_id("<end_of_turn>").unwrap()));
    check_against_fixture(&t, "gemma3.json", &[]);
    speed_check(&t, "gemma3");
}

/// Gemma 3's vocabulary as transformers writes it to `tokenizer.json` (merges in the place of
/// scores, byte fallback), against the `sentencepiece` library's own encoding.
#[test]
fn gemma3_tokenizer_json_matches_reference() {
    let Some(p) = real_file(
        "VORTEX_GEMMA3_TOKENIZER",
        &["gemma3-270m-hf/tokenizer.json"],
        None,
    ) else {
        return;
    };
    let t = Tokenizer::from_hf_file(&p).unwrap();
    assert_eq!(t.vocab_size(), 262144);
    assert_eq!((t.bos_id(), t.eos_id()), (Some(2), Some(1)));
    check_against_fixture(&t, "gemma3.json", &[]);
    speed_check(&t, "gemma3 tokenizer.json");
}

#[test]
fn qwen3_tokenizer_json_matches_reference() {
    let Some(p) = real_file(
        "VORTEX_QWEN3_TOKENIZER",
        &["qwen3-tokenizer/tokenizer.json"],
        None,
    ) else {
        return;
    };
    let t = Tokenizer::from_hf_file(&p).unwrap();
    assert_eq!(t.pre_tokenizer(), &PreTokenizer::Qwen2);
    assert_eq!(t.token_to_id("<think>"), Some(151667));
    assert_eq!(t.eos_id(), t.token_to_id("<|im_end|>"));
    assert_eq!(to_byte_level(" hi"), "Ġhi");
    check_against_fixture(&t, "qwen3.json", &[]);
    speed_check(&t, "qwen3");
}
