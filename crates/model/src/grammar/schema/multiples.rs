//! Numbers held to `multipleOf`, where the multiples are a short expression over their digits:
//! integers dividing 1000 (the last one to three digits decide), and 0.1, 0.01, ... 1e-6 (at
//! most that many decimals, beside bounds too); or, beside bounds on both sides, the multiples
//! between them, listed: of an integer, or on `number` of a decimal (0.25, 0.5, ...).

use serde_json::{Map, Value};

use super::super::rules::Numeric;
use super::numbers::{Bound, spelling};
use super::{MAX_LITERALS, SchemaError, err, invalid};

/// Decimals `multipleOf` may ask for (1e-6).
const MAX_DECIMALS: usize = 6;
/// Decimals a listed fractional `multipleOf` and its bounds may have.
const MAX_LISTED_DECIMALS: usize = 9;

/// What the schema's `multipleOf` asks of its numbers of `kind`.
pub(super) enum Multiples {
    /// Nothing: it is absent, or every integer is a multiple.
    Any,
    /// The numbers an expression over their digits matches.
    Expression(String),
    /// Beside bounds: the multiples of this integer within them, one by one ([`listed`]).
    Listed(f64),
    /// Beside bounds, on numbers: the multiples of this fraction within them, one by one
    /// ([`listed_decimals`]).
    ListedDecimals(f64),
    /// Beside bounds, on numbers: at most this many decimals.
    Decimals(u32),
}

/// What `multipleOf` asks of the numbers of `kind` at a place `bounded` or not. Multiples of
/// an integer are spelled as integers, whatever the kind.
pub(super) fn multiples(
    obj: &Map<String, Value>,
    kind: Numeric,
    bounded: bool,
    at: &str,
) -> Result<Multiples, SchemaError> {
    let Some(v) = obj.get("multipleOf") else {
        return Ok(Multiples::Any);
    };
    let here = format!("{at}/multipleOf");
    let k = match v.as_f64() {
        Some(k) if k > 0.0 && k.is_finite() => k,
        _ => return invalid(&here, "'multipleOf' must be a number above 0"),
    };
    if kind == Numeric::Integer && divides_one(k) {
        return Ok(Multiples::Any);
    }
    // 0.1, 0.01, ... exactly as spelled.
    let decimals =
        Some(places(k)).filter(|&e| (1..=MAX_DECIMALS).contains(&e) && scaled(k, e) == 1);
    if bounded {
        return Ok(match decimals {
            Some(e) if kind == Numeric::Number => Multiples::Decimals(e as u32),
            _ if kind == Numeric::Number && k.fract() != 0.0 => Multiples::ListedDecimals(k),
            _ => Multiples::Listed(k),
        });
    }
    if k.fract() == 0.0 && 1000.0 % k == 0.0 {
        return Ok(Multiples::Expression(integers_divisible_by(k as u32)));
    }
    if let Some(e) = decimals {
        let decimals = format!("-?(?:0|[1-9][0-9]*)(?:\\.[0-9]{{1,{e}}})?");
        return Ok(Multiples::Expression(decimals));
    }
    err(
        &here,
        format!(
            "'multipleOf' {k} is not supported without bounds on both sides (integers \
             dividing 1000, and 0.1, 0.01, ... 1e-{MAX_DECIMALS}, are)"
        ),
    )
}

/// The spellings of the multiples of `k` (the schema's `multipleOf`, an integer) from `lo` to
/// `hi`, for a place held to both.
pub(super) fn listed(
    k: f64,
    (lo, hi): (Option<i128>, Option<i128>),
    at: &str,
) -> Result<Vec<Vec<u8>>, SchemaError> {
    if k.fract() != 0.0 {
        return err(
            &format!("{at}/multipleOf"),
            "a fractional 'multipleOf' beside bounds is supported on 'number' only",
        );
    }
    if k >= 1e18 {
        return err(
            &format!("{at}/multipleOf"),
            "an integer 'multipleOf' beside bounds is supported below 1e18",
        );
    }
    let k = k as i128;
    let (Some(lo), Some(hi)) = (lo, hi) else {
        return err(
            at,
            "'multipleOf' beside bounds needs both a lower and an upper bound",
        );
    };
    let (first, last) = (
        lo.div_euclid(k) + i128::from(lo.rem_euclid(k) != 0),
        hi.div_euclid(k),
    );
    spell_multiples(k, (first, last), 0, at)
}

/// The spellings of the multiples of `k` (the schema's `multipleOf`, a fraction, on `number`)
/// within `lo` and `hi`, for a place held to both: decimals without trailing zeros, worked out
/// exactly over the fewest decimals that spell `k` and both bounds.
pub(super) fn listed_decimals(
    k: f64,
    (lo, hi): (Bound, Bound),
    at: &str,
) -> Result<Vec<Vec<u8>>, SchemaError> {
    let (Some((l, l_in)), Some((h, h_in))) = (lo, hi) else {
        return err(
            at,
            "'multipleOf' beside bounds needs both a lower and an upper bound",
        );
    };
    if places(k) > MAX_LISTED_DECIMALS || k >= 1e15 {
        return err(
            &format!("{at}/multipleOf"),
            format!(
                "a fractional 'multipleOf' beside bounds is supported below 1e15, of at most \
                 {MAX_LISTED_DECIMALS} decimals"
            ),
        );
    }
    if places(l).max(places(h)) > MAX_LISTED_DECIMALS {
        return err(
            at,
            format!(
                "bounds of more than {MAX_LISTED_DECIMALS} decimals beside a fractional \
                 'multipleOf' are not supported"
            ),
        );
    }
    let e = places(k).max(places(l)).max(places(h));
    let (ks, ls, hs) = (scaled(k, e), scaled(l, e), scaled(h, e));
    // The first multiple at or above the lower bound (above, where it is excluded), and the
    // last at or below the upper.
    let first = ls.div_euclid(ks) + i128::from(ls.rem_euclid(ks) != 0 || !l_in);
    let last = hs.div_euclid(ks) - i128::from(hs.rem_euclid(ks) == 0 && !h_in);
    spell_multiples(ks, (first, last), e, at)
}

/// The multiples `i * k` of `k` (in units of 10^-e) for `i` from `first` to `last`, spelled
/// (at most [`MAX_LITERALS`] of them, at least one).
fn spell_multiples(
    k: i128,
    (first, last): (i128, i128),
    e: usize,
    at: &str,
) -> Result<Vec<Vec<u8>>, SchemaError> {
    let multiple = || spelled(k, e);
    match last - first + 1 {
        ..=0 => err(
            at,
            format!("no multiple of {} is within the bounds", multiple()),
        ),
        n if n > MAX_LITERALS as i128 => err(
            at,
            format!(
                "more than {MAX_LITERALS} multiples of {} are within the bounds",
                multiple()
            ),
        ),
        _ => Ok((first..=last)
            .map(|i| spelled(i * k, e).into_bytes())
            .collect()),
    }
}

/// Whether every integer is a multiple of `k`: `k` is 1 / n, exactly as spelled (10^e / K is
/// whole for k = K / 10^e).
fn divides_one(k: f64) -> bool {
    let e = places(k);
    k <= 1.0 && e <= 18 && 10i128.pow(e as u32) % scaled(k, e) == 0
}

/// The decimals of `x`'s shortest spelling (Rust writes floats without an exponent).
fn places(x: f64) -> usize {
    spelling(x).1.len()
}

/// `x` times 10^e, exactly, where `x`'s shortest spelling has at most `e` decimals.
fn scaled(x: f64, e: usize) -> i128 {
    let (int, frac) = spelling(x);
    let v: i128 = format!("{int}{frac:0<e$}")
        .parse()
        .expect("a float's digits");
    if x < 0.0 { -v } else { v }
}

/// `v / 10^e` as a decimal without trailing zeros (nor `-0`).
fn spelled(v: i128, e: usize) -> String {
    let p = 10i128.pow(e as u32);
    let (int, frac) = (v.abs() / p, v.abs() % p);
    let sign = if v < 0 { "-" } else { "" };
    let frac = format!("{frac:0>e$}");
    match frac.trim_end_matches('0') {
        "" => format!("{sign}{int}"),
        f => format!("{sign}{int}.{f}"),
    }
}

/// The integers divisible by `k` (a divisor of 1000) in JSON's spelling, `-0` left out: those
/// below 10^m (`k` divides 10^m) listed, the others' last m digits.
fn integers_divisible_by(k: u32) -> String {
    let m = (0..=3u32)
        .find(|&m| 10u32.pow(m) % k == 0)
        .expect("k divides 1000");
    let top = 10u32.pow(m);
    let small: Vec<String> = (1..top / k).map(|i| (i * k).to_string()).collect();
    let ends: Vec<String> = (0..top / k)
        .map(|i| format!("{:0width$}", i * k, width = m as usize))
        .collect();
    let long = match m {
        0 => "[1-9][0-9]*".to_string(),
        _ => format!("[1-9][0-9]*(?:{})", ends.join("|")),
    };
    match small.is_empty() {
        true => format!("0|-?{long}"),
        false => format!("0|-?(?:{}|{long})", small.join("|")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_multiples_are_listed() {
        let text = |v: Vec<Vec<u8>>| {
            v.into_iter()
                .map(|b| String::from_utf8(b).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            text(listed(3.0, (Some(-7), Some(7)), "#").unwrap()),
            ["-6", "-3", "0", "3", "6"]
        );
        assert_eq!(text(listed(5.0, (Some(5), Some(5)), "#").unwrap()), ["5"]);
        assert!(listed(5.0, (Some(6), Some(9)), "#").is_err());
        assert!(listed(1.0, (Some(0), Some(5000)), "#").is_err());
        assert!(listed(0.5, (Some(0), Some(5)), "#").is_err());
        assert!(listed(2.0, (None, Some(5)), "#").is_err());
    }

    /// Multiples of a fraction are worked out exactly (0.3's are not 0.8999...), spelled
    /// without trailing zeros, each bound taken or excluded as it says.
    #[test]
    fn bounded_multiples_of_a_fraction_are_listed_exactly() {
        let text = |k: f64, lo: Bound, hi: Bound| {
            listed_decimals(k, (lo, hi), "#").map(|v| {
                v.into_iter()
                    .map(|b| String::from_utf8(b).unwrap())
                    .collect::<Vec<_>>()
            })
        };
        let incl = |x: f64| Some((x, true));
        let excl = |x: f64| Some((x, false));
        assert_eq!(
            text(0.25, incl(0.0), incl(1.0)).unwrap(),
            ["0", "0.25", "0.5", "0.75", "1"]
        );
        assert_eq!(
            text(0.5, incl(-1.2), excl(1.0)).unwrap(),
            ["-1", "-0.5", "0", "0.5"]
        );
        assert_eq!(
            text(0.3, excl(0.0), incl(1.2)).unwrap(),
            ["0.3", "0.6", "0.9", "1.2"]
        );
        assert_eq!(
            text(0.05, incl(0.01), excl(0.2)).unwrap(),
            ["0.05", "0.1", "0.15"]
        );
        assert_eq!(text(2.5, incl(-5.0), incl(-5.0)).unwrap(), ["-5"]);
        assert!(text(0.3, incl(0.1), incl(0.2)).is_err());
        assert!(text(0.3, excl(0.3), excl(0.6)).is_err());
        assert!(text(0.002, incl(0.0), incl(10.0)).is_err());
        assert!(text(0.5, None, incl(1.0)).is_err());
        assert!(text(0.5, incl(1e-10), incl(1.0)).is_err());
    }

    #[test]
    fn multiples_of_a_divisor_of_1000_are_listed_then_ended() {
        assert_eq!(integers_divisible_by(1), "0|-?[1-9][0-9]*");
        assert_eq!(integers_divisible_by(5), "0|-?(?:5|[1-9][0-9]*(?:0|5))");
        assert_eq!(integers_divisible_by(100), "0|-?[1-9][0-9]*(?:00)");
        let eight = integers_divisible_by(8);
        assert!(eight.starts_with("0|-?(?:8|16|24|") && eight.contains("(?:000|008|016|"));
    }
}
