//! Strings held to `pattern`, `format`, `minLength` and `maxLength`: what each allows, and
//! random strings and random replies checked against an independent reading of the same rule.

use std::sync::Arc;

use serde_json::json;
use vortex_model::grammar::Grammar;

mod grammar_support;
use grammar_support::*;

#[test]
fn lengths_count_characters_an_escape_as_one() {
    check(
        json!({"type": "string", "minLength": 2, "maxLength": 3}),
        &[r#""ab""#, "\"é€😀\"", r#""a\nb""#, r#""\"\\""#],
        &[
            r#""a""#,
            r#""abcd""#,
            "\"😀😀😀😀\"",
            r#""""#,
            r#""\u0061b""#,
        ],
    );
    check(
        json!({"type": "string", "pattern": "^é+$", "maxLength": 1}),
        &["\"é\""],
        &["\"éé\""],
    );
    check(
        json!({"type": "string", "maxLength": 0}),
        &[r#""""#],
        &[r#"" ""#],
    );
}

#[test]
fn patterns_search_unless_anchored_and_read_classes_as_ecma_does() {
    check(
        json!({"type": "string", "pattern": "[0-9]{3}"}),
        &[r#""ab123c""#, r#""123""#],
        &[r#""ab12c""#, r#""""#],
    );
    check(
        json!({"type": "string", "pattern": "^\\d{3}$"}),
        &[r#""123""#],
        &[r#""1234""#, "\"١٢٣\"", r#"" 123""#],
    );
    check(
        json!({"type": "string", "pattern": "^\\s\\S$"}),
        &["\" x\"", "\"\u{a0}x\""],
        &["\"\u{85}x\"", "\"xx\""],
    );
    // The pattern reads characters as JSON decodes them.
    check(
        json!({"type": "string", "pattern": "^a.b$"}),
        &[r#""axb""#, r#""a\"b""#, r#""a\\b""#],
        &[r#""a\nb""#, r#""a\rb""#, r#""ab""#],
    );
    check(
        json!({"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}),
        &[r#""abc""#],
        &[r#""abcd""#, r#""""#, r#""aB""#],
    );
    check(
        json!({"type": "string", "pattern": "\\bcat\\b"}),
        &[r#""a cat.""#, r#""cat""#],
        &[r#""cats""#, r#""bobcat""#],
    );
}

#[test]
fn formats_hold_their_shapes() {
    let f = |name: &str| json!({"type": "string", "format": name});
    check(
        f("date"),
        &[r#""2024-02-29""#],
        &[r#""2024-13-01""#, r#""2024-1-01""#, r#""2024-02-29T""#],
    );
    check(
        f("time"),
        &[r#""23:59:60Z""#, r#""08:30:00.25+02:00""#],
        &[r#""24:00:00Z""#, r#""08:30:00""#],
    );
    check(
        f("date-time"),
        &[
            r#""2024-02-29T12:30:00Z""#,
            r#""2024-02-29t12:30:00.5-07:00""#,
        ],
        &[r#""2024-02-29 12:30:00Z""#, r#""2024-02-29""#],
    );
    check(
        f("uuid"),
        &[r#""123e4567-e89b-12d3-a456-426614174000""#],
        &[
            r#""123e4567e89b12d3a456426614174000""#,
            r#""123e4567-e89b-12d3-a456-42661417400g""#,
        ],
    );
    check(
        f("email"),
        &[r#""jo.doe+x@mail.example.org""#],
        &[
            r#""jo@""#,
            r#""@example.org""#,
            r#""jo doe@example.org""#,
            r#""jo@-x.org""#,
        ],
    );
    check(
        f("ipv4"),
        &[r#""192.168.0.1""#, r#""0.0.0.0""#],
        &[r#""256.1.1.1""#, r#""1.2.3""#, r#""01.2.3.4""#],
    );
}

#[test]
fn held_strings_are_followed_beside_other_values_and_strings() {
    check(
        json!({"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}]}),
        &["null", r#""2024-01-01""#],
        &[r#""x""#, r#""""#],
    );
    check(
        json!({"anyOf": [{"const": "auto"}, {"type": "string", "format": "date"}]}),
        &[r#""auto""#, r#""2024-01-01""#],
        &[r#""aut""#, r#""autox""#],
    );
    check(
        json!({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "string", "pattern": "^x+$"}]}),
        &[r#""ab""#, r#""xxxx""#, r#""""#],
        &[r#""abc""#, r#""xxa""#],
    );
    check(
        json!({"type": "object", "properties": {"d": {"type": "string", "format": "date"}},
               "required": ["d"]}),
        &[r#"{"d": "2024-01-01"}"#, r#"{"d":"2024-01-01","e":1}"#],
        &[r#"{"d":"2024-01-1"}"#],
    );
    check(
        json!({"type": "array", "items": {"type": "string", "pattern": "^[ab]$"}}),
        &[r#"["a", "b"]"#],
        &[r#"["a", "c"]"#],
    );
    check(
        json!({"allOf": [{"$ref": "#/$defs/d"}], "description": "a day",
               "$defs": {"d": {"type": "string", "format": "date"}}}),
        &[r#""2024-01-01""#],
        &[r#""x""#],
    );
}

#[test]
fn schemas_it_cannot_hold_a_string_to_are_refused_with_the_place() {
    for (schema, at, says) in [
        (
            json!({"type": "string", "pattern": "a", "format": "date"}),
            "#",
            "'pattern' beside 'format'",
        ),
        (
            json!({"type": "string", "format": "hostname"}),
            "#/format",
            "the format \"hostname\" is not supported",
        ),
        (
            json!({"properties": {"a": {"type": "string", "pattern": "a(?=b)"}}}),
            "#/properties/a/pattern",
            "cannot be enforced",
        ),
        (
            json!({"type": "string", "pattern": 1}),
            "#/pattern",
            "must be a string",
        ),
        (
            json!({"type": "string", "pattern": "^(a|bbbb)$", "minLength": 3}),
            "#",
            "'minLength' beside 'pattern' or 'format'",
        ),
        (
            json!({"type": "string", "pattern": "^abcd$", "maxLength": 3}),
            "#",
            "no string of at most 3 characters",
        ),
        (
            json!({"type": "string", "pattern": "^\\x01$"}),
            "#",
            "that JSON can write here meets the pattern",
        ),
        (
            json!({"type": "string", "minLength": 3, "maxLength": 2}),
            "#",
            "more than 'maxLength'",
        ),
        (
            json!({"type": "string", "maxLength": -1}),
            "#/maxLength",
            "non-negative",
        ),
        (
            json!({"allOf": [{"type": "string"}, {"maxLength": 2}]}),
            "#/allOf",
            "only a list of one schema",
        ),
        (
            json!({"allOf": [{"type": "string"}], "type": "string"}),
            "#",
            "'allOf' beside 'type'",
        ),
    ] {
        let e = Grammar::from_schema(&schema).expect_err("refused");
        assert_eq!(e.at, at, "{schema}: {e}");
        assert!(e.message.contains(says), "{schema}: {e}");
    }
}

/// Whether `s` meets the rule, read independently: the pattern searched by another regex
/// engine, lengths in chars.
fn meets(pattern: &fancy_regex::Regex, min: usize, max: usize, s: &str) -> bool {
    let n = s.chars().count();
    (min..=max).contains(&n) && pattern.is_match(s).unwrap()
}

const CASES: [(&str, usize, usize); 6] = [
    ("[0-9]{2}", 0, 6),
    ("^a+b?$", 0, 4),
    ("^(ab|b\"a)*$", 0, 8),
    ("a\\nb|^$", 0, 5),
    ("^[^a]{2,3}$", 0, 3),
    ("b.a", 0, 9),
];

#[test]
fn random_strings_meet_the_rule_exactly_when_the_matcher_takes_them() {
    const ALPHABET: [&str; 8] = ["a", "b", "1", "2", "\n", "\"", "é", " "];
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for (p, min, max) in CASES {
        let schema = json!({"type": "string", "pattern": p, "minLength": min, "maxLength": max});
        let regex = fancy_regex::Regex::new(p).unwrap();
        let mut agreed = [0usize; 2];
        for _ in 0..3000 {
            let len = rng.below(10);
            let s: String = (0..len).map(|_| ALPHABET[rng.below(8)]).collect();
            let want = meets(&regex, min, max, &s);
            let text = serde_json::to_string(&s).unwrap();
            assert_eq!(accepts(&schema, &text), want, "{schema} on {text}");
            agreed[usize::from(want)] += 1;
        }
        assert!(agreed[1] > 20, "{p}: only {} strings met it", agreed[1]);
    }
}

#[test]
fn random_replies_walked_through_the_matcher_meet_the_rule() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for (p, min, max) in CASES {
        let schema = json!({"type": "string", "pattern": p, "minLength": min, "maxLength": max});
        let g = Arc::new(Grammar::from_schema(&schema).unwrap());
        let regex = fancy_regex::Regex::new(p).unwrap();
        for _ in 0..300 {
            let text = random_reply(&g, &mut rng, 4, usize::MAX);
            let text = String::from_utf8(text).unwrap();
            let s: String = serde_json::from_str(&text).unwrap();
            assert!(meets(&regex, min, max, &s), "{p}: {text}");
        }
    }
}
