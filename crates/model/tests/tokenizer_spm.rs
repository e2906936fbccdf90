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
