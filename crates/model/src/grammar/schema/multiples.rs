//! Numbers held to `multipleOf`, where the multiples are a short expression over their digits:
//! integers dividing 1000 (the last one to three digits decide), and 0.1, 0.01, ... 1e-6 (at
//! most that many decimals).

use serde_json::{Map, Value};

use super::super::rules::Numeric;
use super::{SchemaError, err};

/// Decimals `multipleOf` may ask for (1e-6).
const MAX_DECIMALS: i32 = 6;

/// The expression of the numbers of `kind` the schema's `multipleOf` allows, `None` where it
/// allows them all (it is absent, or every integer is a multiple). Multiples of an integer
/// are spelled as integers, whatever the kind.
pub(super) fn multiples(
    obj: &Map<String, Value>,
    kind: Numeric,
    at: &str,
) -> Result<Option<String>, SchemaError> {
    let Some(v) = obj.get("multipleOf") else {
        return Ok(None);
    };
    let here = format!("{at}/multipleOf");
    let k = match v.as_f64() {
        Some(k) if k > 0.0 && k.is_finite() => k,
        _ => return err(&here, "'multipleOf' must be a number above 0"),
    };
    if k.fract() == 0.0 && 1000.0 % k == 0.0 {
        let k = k as u32;
        return Ok((k > 1 || kind == Numeric::Number).then(|| integers_divisible_by(k)));
    }
    // Every integer is a multiple of 1 / n.
    let inverse = 1.0 / k;
    if kind == Numeric::Integer && (inverse - inverse.round()).abs() < 1e-9 {
        return Ok(None);
    }
    if let Some(e) = (1..=MAX_DECIMALS).find(|&e| (k * 10f64.powi(e) - 1.0).abs() < 1e-9) {
        let decimals = format!("-?(?:0|[1-9][0-9]*)(?:\\.[0-9]{{1,{e}}})?");
        return Ok(Some(decimals));
    }
    err(
        &here,
        format!(
            "'multipleOf' {k} is not supported (integers dividing 1000, and 0.1, 0.01, ... \
             1e-{MAX_DECIMALS}, are)"
        ),
    )
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
    fn multiples_of_a_divisor_of_1000_are_listed_then_ended() {
        assert_eq!(integers_divisible_by(1), "0|-?[1-9][0-9]*");
        assert_eq!(integers_divisible_by(5), "0|-?(?:5|[1-9][0-9]*(?:0|5))");
        assert_eq!(integers_divisible_by(100), "0|-?[1-9][0-9]*(?:00)");
        let eight = integers_divisible_by(8);
        assert!(eight.starts_with("0|-?(?:8|16|24|") && eight.contains("(?:000|008|016|"));
    }
}
