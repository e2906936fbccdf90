//! Integers held to `minimum`, `maximum`, `exclusiveMinimum` and `exclusiveMaximum`: the bounds
//! as an expression over the integer's digits, which the matcher follows like any pattern.

use serde_json::{Map, Value};

use super::{SchemaError, err};

/// Bounds past this size are refused: the expressions stay small, the arithmetic exact.
const MAX_BOUND: i128 = 1_000_000_000_000_000_000;

const BOUNDS: [&str; 4] = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"];

/// Whether the schema bounds its numbers.
pub(super) fn bounded(obj: &Map<String, Value>) -> bool {
    BOUNDS.iter().any(|k| obj.contains_key(*k))
}

/// The expression of the integers the bounds allow, in JSON's spelling.
pub(super) fn integer_range(obj: &Map<String, Value>, at: &str) -> Result<String, SchemaError> {
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
    Ok(range(lo, hi))
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
