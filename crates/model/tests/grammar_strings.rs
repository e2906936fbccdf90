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
    check(
        f("ipv6"),
        &[
            r#""2001:db8::8a2e:370:7334""#,
            r#""::""#,
            r#""::1""#,
            r#""fe80::""#,
            r#""1:2:3:4:5:6:7:8""#,
        ],
        &[
            r#""1::2::3""#,
            r#""1:2:3:4:5:6:7:8:9""#,
            r#""12345::""#,
            r#""1:2""#,
            r#""::g""#,
        ],
    );
    // Pydantic's `HttpUrl`: a URI of at least 1 and at most 2083 characters.
    check(
        json!({"type": "string", "format": "uri", "minLength": 1, "maxLength": 2083}),
        &[
            r#""https://example.com/a/b?x=1&y=%20#top""#,
            r#""mailto:jo@example.org""#,
            r#""urn:isbn:0451450523""#,
            r#""http://user:pw@host:8080/""#,
            r#""file:///etc/hosts""#,
        ],
        &[
            r#""example.com""#,
            r#""https://exa mple.com""#,
            r#""https://a/%zz""#,
            r#""1http://a""#,
            r#""http://a#b#c""#,
            r#""http://a@b@c""#,
            r#""http://a:b/""#,
        ],
    );
    let label = "a".repeat(63);
    let longest = format!("\"{}.{}.{}.{}\"", label, label, label, "b".repeat(61));
    let too_long = format!("\"{}.{}.{}.{}\"", label, label, label, "b".repeat(62));
    check(
        f("hostname"),
        &[
            r#""example.com""#,
            r#""a""#,
            r#""xn--bcher-kva.example""#,
            r#""a-b.c1""#,
            &format!("\"{label}\""),
            &longest,
        ],
        &[
            r#""-a.com""#,
            r#""a-.com""#,
            r#""a..b""#,
            r#"".a""#,
            r#""a.""#,
            r#""a_b.com""#,
            &format!("\"{label}a\""),
            &too_long,
        ],
    );
    check(
        f("duration"),
        &[
            r#""P3Y6M4DT12H30M5S""#,
            r#""PT36H""#,
            r#""P4W""#,
            r#""P1D""#,
            r#""PT0S""#,
        ],
        &[
            r#""P""#,
            r#""PT""#,
            r#""P1H""#,
            r#""P1S""#,
            r#""P1DT""#,
            r#""P1W2D""#,
            r#""PT1.5S""#,
        ],
    );
}

/// RFC 3986's URI, read by hand: scheme, then an authority and path, an absolute, rootless or
/// empty path, a query and a fragment (no IP literal hosts).
fn is_uri(s: &str) -> bool {
    let pct_ok = |t: &str, extra: &str| {
        let b = t.as_bytes();
        let mut i = 0;
        while i < b.len() {
            let c = b[i] as char;
            if c == '%' {
                if i + 2 >= b.len()
                    || !(b[i + 1].is_ascii_hexdigit() && b[i + 2].is_ascii_hexdigit())
                {
                    return false;
                }
                i += 3;
                continue;
            }
            if !(c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=".contains(c) || extra.contains(c)) {
                return false;
            }
            i += 1;
        }
        true
    };
    let Some((scheme, rest)) = s.split_once(':') else {
        return false;
    };
    let mut sc = scheme.chars();
    if !sc.next().is_some_and(|c| c.is_ascii_alphabetic())
        || !sc.all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
    {
        return false;
    }
    let (rest, fragment) = rest.split_once('#').unwrap_or((rest, ""));
    let (hier, query) = rest.split_once('?').unwrap_or((rest, ""));
    if !pct_ok(fragment, ":@/?") || !pct_ok(query, ":@/?") {
        return false;
    }
    let segments_ok = |path: &str| path.split('/').all(|seg| pct_ok(seg, ":@"));
    if let Some(after) = hier.strip_prefix("//") {
        let (authority, path) = match after.find('/') {
            Some(i) => after.split_at(i),
            None => (after, ""),
        };
        let (user, hostport) = match authority.split_once('@') {
            Some((u, h)) => (u, h),
            None => ("", authority),
        };
        let (host, port) = hostport.split_once(':').unwrap_or((hostport, ""));
        pct_ok(user, ":")
            && pct_ok(host, "")
            && port.chars().all(|c| c.is_ascii_digit())
            && segments_ok(path)
    } else if let Some(after) = hier.strip_prefix('/') {
        !after.starts_with('/') && segments_ok(after)
    } else {
        segments_ok(hier)
    }
}

/// RFC 1123's host name, read by hand.
fn is_hostname(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|l| {
            (1..=63).contains(&l.len())
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// RFC 3339 Appendix A's duration, read by hand.
fn is_duration(s: &str) -> bool {
    // Numbers each followed by one of `units`, in that order, each at most once: the units
    // taken, or None.
    fn fields(s: &str, units: &str) -> Option<String> {
        let (mut taken, mut rest, mut order) = (String::new(), s, units);
        while !rest.is_empty() {
            let digits = rest.chars().take_while(|c| c.is_ascii_digit()).count();
            let unit = rest[digits..].chars().next()?;
            let at = order.find(unit)?;
            if digits == 0 {
                return None;
            }
            taken.push(unit);
            order = &order[at + 1..];
            rest = &rest[digits + 1..];
        }
        Some(taken)
    }
    // Each part's units must run without a gap from where they start.
    let runs = |taken: &str, units: &str| units.contains(taken);
    let Some(body) = s.strip_prefix('P') else {
        return false;
    };
    if let Some(w) = body.strip_suffix('W') {
        return !w.is_empty() && w.chars().all(|c| c.is_ascii_digit());
    }
    let (date, time) = match body.split_once('T') {
        Some((d, t)) => (d, Some(t)),
        None => (body, None),
    };
    let date_ok = fields(date, "YMD").is_some_and(|t| runs(&t, "YMD"));
    let time_ok =
        time.is_none_or(|t| fields(t, "HMS").is_some_and(|u| !u.is_empty() && runs(&u, "HMS")));
    date_ok && time_ok && !(date.is_empty() && time.is_none())
}

#[test]
fn replies_in_the_newer_formats_read_as_their_standards_say() {
    let mut rng = Rng(0x51_7cc1_b727_220a);
    for (format, ok) in [
        ("uri", is_uri as fn(&str) -> bool),
        ("ipv6", |s: &str| s.parse::<std::net::Ipv6Addr>().is_ok()),
        ("duration", is_duration),
        ("hostname", is_hostname),
    ] {
        let g =
            Arc::new(Grammar::from_schema(&json!({"type": "string", "format": format})).unwrap());
        for _ in 0..400 {
            let text = String::from_utf8(random_reply(&g, &mut rng, 6, 4)).unwrap();
            let s: String = serde_json::from_str(&text).unwrap();
            assert!(ok(&s), "{format}: {text}");
        }
    }
    // The readers refuse what they should.
    for bad in ["http://a#b#c", "http://a@b@c", "a:b%z", "1a:b", "a://h:x/"] {
        assert!(!is_uri(bad), "{bad}");
    }
    for bad in ["P", "PT", "P1H", "P1DT", "PT1S2M", "P1M1Y"] {
        assert!(!is_duration(bad), "{bad}");
    }
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
            json!({"type": "string", "format": "iri"}),
            "#/format",
            "the format \"iri\" is not supported",
        ),
        (
            json!({"properties": {"a": {"type": "string", "pattern": "a(?=b)"}}}),
            "#/properties/a/pattern",
            "look-around",
        ),
        (
            json!({"type": "string", "pattern": 1}),
            "#/pattern",
            "must be a string",
        ),
        (
            json!({"type": "string", "pattern": "^(a|bb)$", "minLength": 3}),
            "#",
            "no string of at least 3 characters",
        ),
        (
            json!({"type": "string", "pattern": "^(a|bbbb)$", "minLength": 2, "maxLength": 3}),
            "#",
            "no string of 2 to 3 characters",
        ),
        (
            json!({"type": "string", "format": "date", "minLength": 11}),
            "#",
            "no string of at least 11 characters that JSON can write here meets the format",
        ),
        (
            json!({"type": "string", "pattern": "[a-z]", "minLength": 1_000_000}),
            "#/pattern",
            "more than 1048576 entries",
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

const CASES: [(&str, usize, usize); 11] = [
    ("[0-9]{2}", 0, 6),
    ("^a+b?$", 0, 4),
    ("^(ab|b\"a)*$", 0, 8),
    ("a\\nb|^$", 0, 5),
    ("^[^a]{2,3}$", 0, 3),
    ("b.a", 0, 9),
    // A least length beside the pattern, past its shortest match or asking nothing.
    ("[0-9]{2}", 4, 6),
    ("a|é", 3, 9),
    ("b|\"", 3, 8),
    ("^[^a]{2,3}$", 3, 3),
    ("b.a", 2, 9),
];

/// Anchored patterns that random strings seldom meet, a least length reached through repeats.
const REPEATS: [(&str, usize, usize); 4] = [
    ("^a+b?$", 3, 5),
    ("^(ab|b\"a)*$", 3, 8),
    ("^(é|ab)+$", 3, 9),
    ("^(aaa|bb)+$", 4, 12),
];

#[test]
fn least_lengths_are_reached_through_a_patterns_repeats() {
    check(
        json!({"type": "string", "pattern": "^(ab|b\"a)*$", "minLength": 3}),
        &[r#""abab""#, r#""abb\"a""#, r#""b\"ab\"a""#],
        &[r#""""#, r#""ab""#, r#""aba""#],
    );
    check(
        json!({"type": "string", "pattern": "^(aaa|bb)+$", "minLength": 4, "maxLength": 6}),
        &[r#""aaabb""#, r#""bbbb""#, r#""aaaaaa""#, r#""bbaaa""#],
        &[r#""aaa""#, r#""bb""#, r#""bbbbbbbb""#, r#""aaabbbb""#],
    );
    // The shortest date is ten characters: minLength 10 asks nothing.
    check(
        json!({"type": "string", "format": "date", "minLength": 10}),
        &[r#""2026-12-04""#],
        &[r#""2026-12-4""#],
    );
}

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
    for (p, min, max) in CASES.into_iter().chain(REPEATS) {
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
