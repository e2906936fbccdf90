//! Replies held to a context-free grammar written in GBNF: what it takes and refuses, grammars
//! it refuses with the reason, replies drawn at random that never reach a dead end, and every
//! prefix over a small alphabet.

mod grammar_support;

use std::sync::Arc;

use grammar_support::{Rng, random_reply};
use vortex_model::grammar::{Grammar, Matcher};

fn takes(grammar: &str, text: &str) -> bool {
    let g = Arc::new(Grammar::gbnf(grammar).expect("a grammar"));
    let mut m = Matcher::new(g);
    m.advance(text.as_bytes()) && m.is_complete()
}

fn check(grammar: &str, good: &[&str], bad: &[&str]) {
    for t in good {
        assert!(takes(grammar, t), "{grammar} should take {t:?}");
    }
    for t in bad {
        assert!(!takes(grammar, t), "{grammar} should refuse {t:?}");
    }
}

fn refusal(grammar: &str) -> String {
    Grammar::gbnf(grammar)
        .expect_err("a grammar it refuses")
        .to_string()
}

/// A JSON grammar as llama.cpp writes one: rules over several lines, groups, classes, repeats.
const JSON: &str = r#"
# JSON values, with whitespace of at most one space between parts and no \u escape of a
# lone surrogate
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\/bfnrt] | "u" ([0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}))
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,2})? ws

ws ::= | " "
"#;

#[test]
fn grammars_take_what_they_derive() {
    check(
        r#"root ::= "yes" | "no""#,
        &["yes", "no"],
        &["", "y", "yes ", "maybe", "nope"],
    );
    // Classes, negated classes, ranges and any character; UTF-8 of every length.
    check(
        r#"root ::= [a-cx] [^a-z] . [é-ë] [😀-😂]"#,
        &["a1zé😀", "xZ€ë😂", "b  ê😁"],
        &["d1zé😀", "aazé😀", "a1zè😀", "a1zé😃", "a1z"],
    );
    // Repeats: *, +, ?, {m}, {m,}, {m,n}; a rule that refers to itself at its end.
    check(
        r#"root ::= "a"* "b"+ "c"? d{2} e{1,} f{0,2}
           d ::= "d"
           e ::= "e"
           f ::= "f""#,
        &["bdde", "aabbcddeeeff", "bcddef"],
        &[
            "",
            "adde",
            "bddde".get(..4).unwrap(),
            "bdd",
            "bddefff",
            "bcdde ",
            "bccdde",
        ],
    );
    check(
        r#"root ::= item ("," item)*
           item ::= [0-9]+ | "(" root ")""#,
        &["1", "1,22", "(1,2),3", "((4))"],
        &["", "1,", "(1", "1)", ",1"],
    );
    // Escapes in literals and classes; a comment; alternatives on lines of their own.
    check(
        "root ::= \"\\\"\\n\\t\\\\\" [\\x41-\\x42] \"\\u00e9\" # a comment\n  | \"\\U0001F600\"",
        &["\"\n\t\\Aé", "\"\n\t\\Bé", "😀"],
        &["\"\n\t\\Cé"],
    );
    // A grammar's text may end with nothing left: "a" then any run of spaces.
    check(
        r#"root ::= "a" ws
             ws ::= " "*"#,
        &["a", "a   "],
        &["a a"],
    );
}

/// Whether a reply may end, and whether nothing may follow, where several ways stay open or
/// what is left can only be empty; a root that may be empty.
#[test]
fn replies_end_where_the_grammar_lets_them() {
    let at = |grammar: &str, text: &str| {
        let mut m = Matcher::new(Arc::new(Grammar::gbnf(grammar).unwrap()));
        assert!(m.advance(text.as_bytes()), "{grammar}: {text}");
        (m.is_complete(), m.is_done())
    };
    assert_eq!(at(r#"root ::= "a" | "ab""#, "a"), (true, false));
    assert_eq!(at(r#"root ::= "a" | "ab""#, "ab"), (true, true));
    assert_eq!(at(r#"root ::= "a" " "*"#, "a"), (true, false));
    assert_eq!(at("root ::= e \"a\" e\ne ::= \"\"", "a"), (true, true));
    assert_eq!(at(r#"root ::= "a"?"#, ""), (true, false));
    assert_eq!(at(r#"root ::= "a"*"#, ""), (true, false));
    assert_eq!(at(r#"root ::= """#, ""), (true, true));
    assert_eq!(at(r#"root ::= "a"+"#, ""), (false, false));
    // As llama.cpp reads them: space before a repeat, repeats one after another, `-` last in
    // a class.
    check(r#"root ::= "a" * "b" +"#, &["b", "aabb"], &["", "a"]);
    check(r#"root ::= [ab]{2}?"#, &["", "ab", "bb"], &["a", "abab"]);
    check(r#"root ::= [a-] [+-]"#, &["a-", "--", "a+"], &["b-", "a"]);
}

#[test]
fn json_of_the_llama_grammar_is_json() {
    check(
        JSON,
        &[
            r#"{}"#,
            r#"{"a": [1, -2.5e3, true, null, {"b": "\u00e9\n"}]}"#,
            r#"{"k":"v","n":{}}"#,
        ],
        &[r#"{"a":}"#, "[1]", r#"{"a" 1}"#, r#"{"a":01}"#],
    );
    let g = Arc::new(Grammar::gbnf(JSON).unwrap());
    let mut rng = Rng(0x9b05_688c_2b3e_6c1f);
    for _ in 0..300 {
        let text = random_reply(&g, &mut rng, 6, 4);
        let v: serde_json::Value = serde_json::from_slice(&text)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&text)));
        assert!(v.is_object());
    }
}

#[test]
fn grammars_it_cannot_follow_are_refused_with_the_reason() {
    for (grammar, says) in [
        (r#"root ::= root "a" | "a""#, "left recursion"),
        (
            r#"root ::= e
               e ::= s e "+" | "1"
               s ::= " "*"#,
            "rule 'e': left recursion",
        ),
        (
            r#"root ::= "[" ("a"*)* "]""#,
            "a repeat or group in rule 'root': left recursion",
        ),
        (
            r#"root ::= "x" e
               e ::= e "+" "1" | "1""#,
            "rule 'e': left recursion",
        ),
        (r#"root ::= item"#, "rule 'item' is not defined"),
        (r#"start ::= "a""#, "no rule named 'root'"),
        ("root ::= \"a\"\nroot ::= \"b\"", "defined twice"),
        (r#"root ::= "a"#, "a closing `\"`"),
        (r#"root ::= [ab"#, "a closing `]`"),
        (r#"root ::= [a-"#, "expected a character"),
        (r#"root ::= "\q""#, "an escape"),
        (r#"root ::= [z-a]"#, "not after its last"),
        (r#"root ::= "a"{3,2}"#, "most is not below its least"),
        (r#"root ::= "a"{100000}"#, "a count from 0 to 10000"),
        (
            r#"root ::= x
               x ::= "a" x"#,
            "derives no text",
        ),
        (r#"root ::= [^\x00-\U0010FFFF]"#, "derives no text"),
        (r#"root ::= ("a""#, "`)`"),
        ("root ::= \"a\" ::=", "a literal, a class"),
        (r#"root ::= ("a"{10000}){10000}"#, "more than 1048576 items"),
        (r#"root ::= "a"?*"#, "left recursion"),
        (
            &format!("root ::= \"a\"{}", "*".repeat(60_000)),
            "at most 8 repeats in a row",
        ),
    ] {
        let msg = refusal(grammar);
        assert!(msg.contains(says), "{grammar}: {msg}");
    }
    // Alternatives that can never end are dropped, the others kept.
    check(
        r#"root ::= "a" | loop
           loop ::= "b" loop"#,
        &["a"],
        &["b"],
    );
}

/// Every prefix over a small alphabet that a grammar takes has a way on, or is whole; every
/// whole one matches an equivalent regular expression.
#[test]
fn prefixes_never_dead_end() {
    let grammar = r#"root ::= "[" (item ("," item)*)? "]"
                     item ::= "a"+ | "(" item? ")" | [0-9]{1,2} "b"?"#;
    let g = Arc::new(Grammar::gbnf(grammar).unwrap());
    let alphabet = b"[](),a1b";
    let mut level = vec![Vec::<u8>::new()];
    let (mut walked, mut whole) = (0, 0);
    for _ in 0..9 {
        let mut next = Vec::new();
        for text in &level {
            let mut m = Matcher::new(g.clone());
            assert!(m.advance(text));
            let any = (0..=255u8).any(|b| m.accepts(&[b]));
            let complete = m.is_complete();
            assert!(
                any || complete,
                "a dead end after {}",
                String::from_utf8_lossy(text)
            );
            if complete {
                whole += 1;
                assert!(balanced_list(text), "{}", String::from_utf8_lossy(text));
            }
            for &b in alphabet {
                if m.accepts(&[b]) {
                    next.push([text.as_slice(), &[b]].concat());
                }
            }
        }
        walked += level.len();
        level = next;
    }
    assert!(walked > 1000 && whole > 100, "{walked} {whole}");
}

/// The language of the grammar above, checked by hand.
fn balanced_list(text: &[u8]) -> bool {
    fn item(t: &[u8]) -> bool {
        if !t.is_empty() && t.iter().all(|&b| b == b'a') {
            return true;
        }
        if let [b'(', inner @ .., b')'] = t {
            return inner.is_empty() || item(inner);
        }
        let digits = t.iter().take_while(|b| b.is_ascii_digit()).count();
        (1..=2).contains(&digits) && matches!(&t[digits..], [] | [b'b'])
    }
    let [b'[', inner @ .., b']'] = text else {
        return false;
    };
    inner.is_empty() || inner.split(|&b| b == b',').all(item)
}

#[test]
fn replies_drawn_at_random_end_and_never_dead_end() {
    for grammar in [
        r#"root ::= (word " ")* word "."
           word ::= [a-zA-Zé]+"#,
        r#"root ::= "<" tag ">" [^<]{0,12} ("<" tag "/>" [^<]{0,12})? "</" tag ">"
           tag ::= "b" | "i""#,
    ] {
        let g = Arc::new(Grammar::gbnf(grammar).unwrap());
        let mut rng = Rng(0x1f83_d9ab_fb41_bd6b);
        for _ in 0..200 {
            let text = random_reply(&g, &mut rng, 8, 3);
            assert!(takes(grammar, std::str::from_utf8(&text).unwrap()));
        }
    }
}

/// On SmolLM2's vocabulary, if its GGUF is in the model cache: a JSON reply written byte by
/// byte under the JSON grammar, each mask checked against every token tried alone at a few
/// points and timed throughout (the states met are numbered, and the bytes between them
/// looked up, as they recur).
#[test]
fn the_mask_on_a_real_vocabulary_matches_brute_force_and_is_timed() {
    use std::time::{Duration, Instant};
    use vortex_model::grammar::{Constraint, Vocabulary};
    let Ok(path) = vortex_model::fetch::cached_path("smollm2-135m") else {
        return;
    };
    if !path.is_file() {
        println!("SKIP: no smollm2-135m in the model cache");
        return;
    }
    let file = vortex_model::gguf::GgufFile::open(&path).unwrap();
    let tok = vortex_model::gguf_model::gguf_tokenizer(&file).unwrap();
    let vocab = Arc::new(Vocabulary::of(&tok));
    let g = Arc::new(Grammar::gbnf(JSON).unwrap());
    let byte = |b: u8| {
        (0..vocab.size() as u32)
            .find(|&id| vocab.bytes(id) == [b])
            .unwrap()
    };
    let text = br#"{"name": "hello world and more", "tags": ["a", "bb"], "n": 12345}"#;
    let mut c = Constraint::new(g.clone(), vocab.clone(), Vec::new());
    let mut m = Matcher::new(g);
    let (mut total, mut worst) = (Duration::ZERO, Duration::ZERO);
    for (i, &b) in text.iter().enumerate() {
        let start = Instant::now();
        let set = c.allowed().clone();
        let took = start.elapsed();
        (total, worst) = (total + took, worst.max(took));
        if [0, 1, 10, 11, 40].contains(&i) {
            for id in 0..vocab.size() as u32 {
                let bytes = vocab.bytes(id);
                let want = !bytes.is_empty() && m.accepts(bytes);
                assert_eq!(set.contains(id), want, "at byte {i}, token {id}");
            }
        }
        assert!(set.contains(byte(b)));
        assert!(c.accept(byte(b)) && m.advance(&[b]));
    }
    println!(
        "{} masks over {} tokens: {total:?} in all, {:?} each, the slowest {worst:?}",
        text.len(),
        vocab.size(),
        total / text.len() as u32
    );
}

/// The items of a grammar are counted once each, however deep its repeats: 600,000 are
/// taken.
#[test]
fn nested_repeats_count_their_items_once() {
    let g = Grammar::gbnf(r#"root ::= (("a"{100}){100}){60}"#).unwrap();
    let mut m = Matcher::new(Arc::new(g));
    assert!(m.advance(&[b'a'; 1000]));
    assert!(!m.is_complete());
}
