//! Numbers held to `minimum`, `maximum`, `exclusiveMinimum` and `exclusiveMaximum`: the bounds
//! as an expression over the number's digits, which the matcher follows like any pattern.

use serde_json::{Map, Value};

use super::{SchemaError, err};

/// Bounds past this size are refused: the expressions stay small, the arithmetic exact.
const MAX_BOUND: i128 = 1_000_000_000_000_000_000;

/// The largest bound on `number` read exactly (2^53).
const MAX_EXACT: f64 = 9_007_199_254_740_992.0;

const BOUNDS: [&str; 4] = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"];

/// Whether the schema bounds its numbers.
pub(super) fn bounded(obj: &Map<String, Value>) -> bool {
    BOUNDS.iter().any(|k| obj.contains_key(*k))
}

/// The expression of the integers the bounds allow, in JSON's spelling.
pub(super) fn integer_range(obj: &Map<String, Value>, at: &str) -> Result<String, SchemaError> {
    let (lo, hi) = integer_bounds(obj, at)?;
    Ok(range(lo, hi))
}

/// The least and greatest integers the bounds allow (`None`: no bound on that side).
pub(super) fn integer_bounds(
    obj: &Map<String, Value>,
    at: &str,
) -> Result<(Option<i128>, Option<i128>), SchemaError> {
    let mut lo: Option<i128> = None;
    let mut hi: Option<i128> = None;
    for key in BOUNDS {
        let Some(v) = obj.get(key) else { continue };
        let here = format!("{at}/{key}");
        let Some(x) = v.as_f64() else {
            return err(&here, format!("'{key}' must be a number"));
        };
        if x.abs() > MAX_BOUND as f64 {
            return err(
                &here,
                format!("bounds past 1e18 are not supported, got {x}"),
            );
        }
        let whole = v
            .as_i64()
            .map(i128::from)
            .or((x.fract() == 0.0).then_some(x as i128));
        // The nearest integer within: an exclusive integer bound steps over itself.
        let (low, b) = match (key, whole) {
            ("minimum", Some(b)) => (true, b),
            ("exclusiveMinimum", Some(b)) => (true, b + 1),
            ("maximum", Some(b)) => (false, b),
            (_, Some(b)) => (false, b - 1),
            ("minimum" | "exclusiveMinimum", None) => (true, x.ceil() as i128),
            (_, None) => (false, x.floor() as i128),
        };
        match low {
            true => lo = lo.max(Some(b)),
            false => hi = Some(hi.map_or(b, |h| h.min(b))),
        }
    }
    if let (Some(l), Some(h)) = (lo, hi)
        && l > h
    {
        return err(
            at,
            format!("no integer is within the bounds (from {l} to {h})"),
        );
    }
    Ok((lo, hi))
}

/// Decimals a number may still take (`None`: any number).
type Cap = Option<u32>;

/// A bound on `number`: its value, and whether it is allowed itself.
pub(super) type Bound = Option<(f64, bool)>;

/// The numbers the bounds allow, written without an exponent (JSON's spelling otherwise), with
/// at most `decimals` decimals where set (`multipleOf` 0.1, 0.01, ...).
pub(super) fn number_range(
    obj: &Map<String, Value>,
    at: &str,
    decimals: Cap,
) -> Result<String, SchemaError> {
    let (lo, hi) = number_bounds(obj, at)?;
    let mut parts = Vec::new();
    let zero = (0, String::new());
    // Zero and above.
    if hi.is_none_or(|(h, _)| h >= 0.0) {
        let from = match lo {
            Some((l, incl)) if l >= 0.0 => (decimal(l), incl),
            _ => (zero.clone(), true),
        };
        let to = hi.map(|(h, incl)| (decimal(h), incl));
        parts.extend(magnitudes(from, to, decimals));
    }
    // Below zero: a minus sign, then the magnitudes (never zero).
    if lo.is_none_or(|(l, _)| l < 0.0) {
        let from = match hi {
            Some((h, incl)) if h < 0.0 => (decimal(-h), incl),
            _ => (zero, false),
        };
        let to = lo.map(|(l, incl)| (decimal(-l), incl));
        parts.extend(magnitudes(from, to, decimals).map(|m| format!("-(?:{m})")));
    }
    if parts.is_empty() {
        return err(at, "no number is within the bounds");
    }
    Ok(parts.join("|"))
}

/// The tighter bound of each side on `number`, read exactly (at most 2^53, none nearer 0 than
/// 1e-12 but 0).
pub(super) fn number_bounds(
    obj: &Map<String, Value>,
    at: &str,
) -> Result<(Bound, Bound), SchemaError> {
    let mut lo: Bound = None;
    let mut hi: Bound = None;
    for key in BOUNDS {
        let Some(v) = obj.get(key) else { continue };
        let here = format!("{at}/{key}");
        let Some(x) = v.as_f64() else {
            return err(&here, format!("'{key}' must be a number"));
        };
        // A double holds every integer up to 2^53 exactly; past it the bound read is not the
        // bound written.
        let too_big = match v.as_i64() {
            Some(i) => i.unsigned_abs() > MAX_EXACT as u64,
            None => x.abs() > MAX_EXACT,
        };
        if too_big || (x != 0.0 && x.abs() < 1e-12) {
            return err(
                &here,
                format!(
                    "bounds on 'number' past 2^53 or nearer 0 than 1e-12 are not supported, got {x}"
                ),
            );
        }
        let bound = (x, !key.starts_with("exclusive"));
        // Of two equal bounds the exclusive one is tighter.
        let tighter = |old: Bound, up: bool| match old {
            Some((y, incl)) if y == x => Some((x, incl && bound.1)),
            Some((y, _)) if (y > x) == up => old,
            _ => Some(bound),
        };
        match key.to_ascii_lowercase().contains("min") {
            true => lo = tighter(lo, true),
            false => hi = tighter(hi, false),
        }
    }
    Ok((lo, hi))
}

/// The digits of |x|'s shortest spelling before and after the point (none after for a whole
/// number): Rust writes floats without an exponent, in the fewest digits that read back the
/// same.
pub(super) fn spelling(x: f64) -> (String, String) {
    let text = format!("{}", x.abs());
    match text.split_once('.') {
        Some((int, frac)) => (int.to_string(), frac.trim_end_matches('0').to_string()),
        None => (text, String::new()),
    }
}

/// A non-negative bound as its integer part and its fraction's digits, without trailing zeros.
fn decimal(x: f64) -> (i128, String) {
    let (int, frac) = spelling(x);
    (int.parse().expect("a float's integer part is digits"), frac)
}

/// The spellings of the numbers from `lo` to `hi` (none above where `None`), each end allowed
/// itself where its flag says so, of at most `cap` decimals; `None` if there are none.
fn magnitudes(
    ((ai, af), a_in): ((i128, String), bool),
    hi: Option<((i128, String), bool)>,
    cap: Cap,
) -> Option<String> {
    let any = match cap {
        None => "(?:\\.[0-9]+)?".to_string(),
        Some(c) => format!("(?:\\.[0-9]{{1,{c}}})?"),
    };
    let low = Lower::new(&af, a_in);
    let mut parts = Vec::new();
    let mut whole = |from: i128, to: Option<i128>| {
        if to.is_none_or(|t| from <= t) {
            parts.push(format!("(?:{}){any}", naturals(from, to)));
        }
    };
    match hi {
        None => {
            whole(ai + 1, None);
            parts.extend(fraction(low, Upper::Free, cap).map(|f| format!("{ai}{f}")));
        }
        Some(((bi, bf), b_in)) => {
            let high = Upper::new(&bf, b_in);
            if ai == bi {
                parts.extend(fraction(low, high?, cap).map(|f| format!("{ai}{f}")));
            } else if ai < bi {
                whole(ai + 1, Some(bi - 1));
                parts.extend(fraction(low, Upper::Free, cap).map(|f| format!("{ai}{f}")));
                parts.extend(
                    high.and_then(|h| fraction(Lower::Free, h, cap))
                        .map(|f| format!("{bi}{f}")),
                );
            }
        }
    }
    (!parts.is_empty()).then(|| parts.join("|"))
}

/// What the rest of a fraction's digits must do for the number to stay at or above a bound.
#[derive(Clone, PartialEq)]
enum Lower {
    Free,
    /// Some digit still to come must not be zero.
    NonZero,
    /// The digits must read at least these (more if not `incl`).
    AtLeast(String, bool),
}

impl Lower {
    fn new(frac: &str, incl: bool) -> Lower {
        match (frac.is_empty(), incl) {
            (true, true) => Lower::Free,
            (true, false) => Lower::NonZero,
            (false, _) => Lower::AtLeast(frac.to_string(), incl),
        }
    }

    fn step(&self, d: u8) -> Option<Lower> {
        match self {
            Lower::Free => Some(Lower::Free),
            Lower::NonZero if d > b'0' => Some(Lower::Free),
            Lower::NonZero => Some(Lower::NonZero),
            Lower::AtLeast(g, incl) => {
                let g0 = g.as_bytes()[0];
                match d.cmp(&g0) {
                    std::cmp::Ordering::Greater => Some(Lower::Free),
                    std::cmp::Ordering::Equal => Some(Lower::new(&g[1..], *incl)),
                    std::cmp::Ordering::Less => None,
                }
            }
        }
    }

    fn may_end(&self) -> bool {
        *self == Lower::Free
    }
}

/// What the rest of a fraction's digits must do for the number to stay at or below a bound.
#[derive(Clone, PartialEq)]
enum Upper {
    Free,
    /// Only zeros may follow.
    Zeros,
    /// The digits must read at most these (less if not `incl`).
    AtMost(String, bool),
}

impl Upper {
    /// `None`: nothing more may be written (the bound is reached and excluded).
    fn new(frac: &str, incl: bool) -> Option<Upper> {
        match (frac.is_empty(), incl) {
            (true, true) => Some(Upper::Zeros),
            (true, false) => None,
            (false, _) => Some(Upper::AtMost(frac.to_string(), incl)),
        }
    }

    fn step(&self, d: u8) -> Option<Upper> {
        match self {
            Upper::Free => Some(Upper::Free),
            Upper::Zeros if d == b'0' => Some(Upper::Zeros),
            Upper::Zeros => None,
            Upper::AtMost(g, incl) => {
                let g0 = g.as_bytes()[0];
                match d.cmp(&g0) {
                    std::cmp::Ordering::Less => Some(Upper::Free),
                    std::cmp::Ordering::Equal => Upper::new(&g[1..], *incl),
                    std::cmp::Ordering::Greater => None,
                }
            }
        }
    }
}

/// The fractions (none, or `.` and at most `cap` digits) the two bounds leave, if any.
fn fraction(low: Lower, high: Upper, cap: Cap) -> Option<String> {
    let digits = digits(&low, &high, cap);
    match (low.may_end(), digits) {
        (true, Some(d)) => Some(format!("(?:\\.{d})?")),
        (true, None) => Some(String::new()),
        (false, Some(d)) => Some(format!("\\.{d}")),
        (false, None) => None,
    }
}

/// One or more digits, at most `cap`, that keep to both bounds.
fn digits(low: &Lower, high: &Upper, cap: Cap) -> Option<String> {
    // The states that a zero leads back to themselves.
    match (low, high, cap) {
        (_, _, Some(0)) => return None,
        (Lower::Free, Upper::Free, None) => return Some("[0-9]+".into()),
        (Lower::Free, Upper::Free, Some(c)) => return Some(format!("[0-9]{{1,{c}}}")),
        (Lower::Free, Upper::Zeros, None) => return Some("0+".into()),
        (Lower::Free, Upper::Zeros, Some(c)) => return Some(format!("0{{1,{c}}}")),
        (Lower::NonZero, Upper::Free, None) => return Some("0*[1-9][0-9]*".into()),
        (Lower::NonZero, Upper::Zeros, _) => return None,
        _ => {}
    }
    let rest_cap = cap.map(|c| c - 1);
    let mut parts = Vec::new();
    let mut d = b'0';
    while d <= b'9' {
        let (l, h) = (low.step(d), high.step(d));
        // The run of digits after `d` that lead to the same states.
        let mut e = d;
        while e < b'9' && low.step(e + 1) == l && high.step(e + 1) == h {
            e += 1;
        }
        if let (Some(l), Some(h)) = (l, h) {
            let class = match d == e {
                true => char::from(d).to_string(),
                false => format!("[{}-{}]", char::from(d), char::from(e)),
            };
            let rest = match (l.may_end(), digits(&l, &h, rest_cap)) {
                (true, Some(r)) => format!("(?:{r})?"),
                (true, None) => String::new(),
                (false, Some(r)) => r,
                (false, None) => {
                    d = e + 1;
                    continue;
                }
            };
            parts.push(format!("{class}{rest}"));
        }
        d = e + 1;
    }
    (!parts.is_empty()).then(|| format!("(?:{})", parts.join("|")))
}

/// The integers from `lo` to `hi` (either end open where `None`).
fn range(lo: Option<i128>, hi: Option<i128>) -> String {
    let mut parts = Vec::new();
    // Zero and above.
    if hi.is_none_or(|h| h >= 0) {
        parts.push(naturals(lo.unwrap_or(0).max(0), hi));
    }
    // Below zero: a minus sign, then the magnitudes.
    if lo.is_none_or(|l| l < 0) {
        let top = lo.map(|l| -l);
        let bottom = hi.map_or(1, |h| (-h).max(1));
        parts.push(format!("-(?:{})", naturals(bottom, top)));
    }
    parts.join("|")
}

/// The naturals from `a` to `b` (no end where `None`), without leading zeros.
fn naturals(a: i128, b: Option<i128>) -> String {
    let digits = |n: i128| n.to_string().len();
    let top = b.unwrap_or(i128::MAX);
    let mut parts = Vec::new();
    let last = b.map_or(digits(a), digits);
    for len in digits(a)..=last {
        let first = if len == 1 {
            0
        } else {
            10i128.pow(len as u32 - 1)
        };
        let lo = a.max(first);
        let hi = top.min(10i128.pow(len as u32) - 1);
        if lo <= hi {
            parts.push(same_length(&lo.to_string(), &hi.to_string()));
        }
    }
    if b.is_none() {
        parts.push(format!("[1-9][0-9]{{{},}}", last));
    }
    parts.join("|")
}

/// The numbers of one length from `x` to `y`, digit by digit.
fn same_length(x: &str, y: &str) -> String {
    let (Some(x0), Some(y0)) = (x.chars().next(), y.chars().next()) else {
        return String::new();
    };
    let (xs, ys) = (&x[1..], &y[1..]);
    let n = xs.len();
    if x0 == y0 {
        return format!("{x0}{}", same_length(xs, ys));
    }
    let (zeros, nines) = ("0".repeat(n), "9".repeat(n));
    let any = |lo: char, hi: char| match n {
        0 => format!("[{lo}-{hi}]"),
        _ => format!("[{lo}-{hi}][0-9]{{{n}}}"),
    };
    if xs == zeros && ys == nines {
        return any(x0, y0);
    }
    let mut parts = vec![format!("{x0}{}", same_length(xs, &nines))];
    let (a, b) = (next(x0), prev(y0));
    if a <= b {
        parts.push(any(a, b));
    }
    parts.push(format!("{y0}{}", same_length(&zeros, ys)));
    format!("(?:{})", parts.join("|"))
}

fn next(d: char) -> char {
    char::from(d as u8 + 1)
}

fn prev(d: char) -> char {
    char::from(d as u8 - 1)
}

#[cfg(test)]
mod tests {
    use super::range;
    use crate::grammar::pattern::Pattern;

    fn matches(p: &Pattern, text: &str) -> bool {
        let mut s = p.start();
        for b in text.bytes() {
            match p.next(s, b) {
                Some(n) => s = n,
                None => return false,
            }
        }
        p.matches(s)
    }

    /// Decimals near the bounds, written every way JSON allows without an exponent, are matched
    /// exactly when they are within them (and, capped as `multipleOf` 0.1, 0.01 or 0.001 caps
    /// them, of at most that many decimals).
    #[test]
    fn number_ranges_match_exactly_their_numbers() {
        type Bound = Option<(f64, bool)>;
        let bounds: [(Bound, Bound); 12] = [
            (Some((0.0, true)), Some((1.0, true))),
            (Some((0.0, false)), Some((1.0, false))),
            (Some((0.25, true)), None),
            (Some((-1.5, false)), Some((2.05, true))),
            (None, Some((-0.3, true))),
            (None, Some((0.0, false))),
            (Some((1.5, true)), Some((1.5, true))),
            (Some((12.345, false)), Some((12.35, true))),
            (Some((-10.0, true)), Some((-9.99, false))),
            (Some((0.0, false)), None),
            (Some((-0.05, true)), Some((0.05, true))),
            (Some((99.9, true)), Some((100.1, false))),
        ];
        let mut texts = Vec::new();
        for i in -1200i32..1200 {
            for frac in [
                "", ".0", ".5", ".05", ".00", ".001", ".95", ".999", ".34", ".345", ".3451",
            ] {
                let int = (i / 10).abs();
                let sign = if i < 0 { "-" } else { "" };
                texts.push(format!("{sign}{int}{frac}"));
                texts.push(format!("{sign}{}{frac}", i.abs()));
            }
        }
        for (lo, hi) in bounds {
            let mut obj = serde_json::Map::new();
            if let Some((l, incl)) = lo {
                let key = if incl { "minimum" } else { "exclusiveMinimum" };
                obj.insert(key.into(), l.into());
            }
            if let Some((h, incl)) = hi {
                let key = if incl { "maximum" } else { "exclusiveMaximum" };
                obj.insert(key.into(), h.into());
            }
            for cap in [None, Some(1), Some(2), Some(3)] {
                let Ok(regex) = super::number_range(&obj, "#", cap) else {
                    // Refused only where no number of `cap` decimals is within the bounds.
                    assert!(
                        texts.iter().all(|t| !within(lo, hi, cap, t)),
                        "{lo:?}..{hi:?}"
                    );
                    continue;
                };
                let re = Pattern::new(&regex, &regex).unwrap();
                for t in &texts {
                    let want = within(lo, hi, cap, t);
                    assert_eq!(
                        matches(&re, t),
                        want,
                        "{lo:?}..{hi:?} {cap:?}: {t} ({regex})"
                    );
                }
                for t in ["01", "1.", ".5", "+1", "1e2", "-", ""] {
                    assert!(!matches(&re, t), "{lo:?}..{hi:?}: {t}");
                }
            }
        }
    }

    /// Whether `t` is within the bounds, of at most `cap` decimals, and not minus zero.
    fn within(lo: Option<(f64, bool)>, hi: Option<(f64, bool)>, cap: Option<u32>, t: &str) -> bool {
        let x: f64 = t.parse().unwrap();
        let places = t.split_once('.').map_or(0, |(_, f)| f.len());
        let negative_zero = t.starts_with('-') && x == 0.0;
        !negative_zero
            && cap.is_none_or(|c| places <= c as usize)
            && lo.is_none_or(|(l, incl)| x > l || incl && x == l)
            && hi.is_none_or(|(h, incl)| x < h || incl && x == h)
    }

    /// Every integer near the bounds is matched exactly when it is within them.
    #[test]
    fn ranges_match_exactly_their_integers() {
        let bounds = [
            (Some(0), None),
            (Some(5), None),
            (Some(-3), Some(17)),
            (None, Some(-7)),
            (None, Some(250)),
            (Some(-1000), Some(-999)),
            (Some(19), Some(2001)),
            (Some(123), Some(123)),
            (Some(-40), Some(0)),
            (Some(1), Some(999_999)),
        ];
        for (lo, hi) in bounds {
            let regex = range(lo, hi);
            let re = Pattern::new(&regex, &regex).unwrap();
            for x in (-3000..3000).chain([999_999, 1_000_000, -1_000_000, 10i128.pow(15)]) {
                let want = lo.is_none_or(|l| x >= l) && hi.is_none_or(|h| x <= h);
                assert_eq!(matches(&re, &x.to_string()), want, "{lo:?}..{hi:?}: {x}");
            }
            for text in ["01", "-0", "00", "1.0", "+1", ""] {
                assert!(!matches(&re, text), "{lo:?}..{hi:?}: {text}");
            }
        }
    }
}
