//! Percentiles and the summary of one latency series.

use serde::Serialize;

/// The `p`-th percentile (0..=100) of `sorted` (ascending), interpolating linearly between the
/// two nearest ranks; `None` when empty.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let rank = (p.clamp(0.0, 100.0) / 100.0) * (n - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    let frac = rank - lo as f64;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * frac)
}

/// Mean, spread and percentiles of one metric, in the unit of the values given (ms here).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub count: usize,
    pub mean: f64,
    pub std: f64,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl Summary {
    /// Summary of `values`; NaN values are dropped. All zero when nothing is left.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Summary {
        let mut v: Vec<f64> = values.into_iter().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return Summary::default();
        }
        v.sort_by(f64::total_cmp);
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
        let p = |q| percentile(&v, q).unwrap();
        Summary {
            count: v.len(),
            mean,
            std: var.sqrt(),
            min: v[0],
            p50: p(50.0),
            p90: p(90.0),
            p95: p(95.0),
            p99: p(99.0),
            max: v[v.len() - 1],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn percentiles_interpolate() {
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[3.0], 99.0), Some(3.0));
        let v = [1.0, 2.0, 3.0, 4.0];
        assert!(close(percentile(&v, 0.0).unwrap(), 1.0));
        assert!(close(percentile(&v, 50.0).unwrap(), 2.5));
        assert!(close(percentile(&v, 100.0).unwrap(), 4.0));
        assert!(close(percentile(&v, 25.0).unwrap(), 1.75));
        // 1..=100: rank 0.99 * 99 = 98.01 -> 99.01.
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert!(close(percentile(&v, 99.0).unwrap(), 99.01));
        assert!(close(percentile(&v, 95.0).unwrap(), 95.05));
        assert!(close(percentile(&v, 50.0).unwrap(), 50.5));
    }

    #[test]
    fn summary_sorts_and_skips_nan() {
        let s = Summary::of([5.0, f64::NAN, 1.0, 3.0]);
        assert_eq!(s.count, 3);
        assert!(close(s.mean, 3.0));
        assert!(close(s.p50, 3.0));
        assert_eq!((s.min, s.max), (1.0, 5.0));
        assert!(close(s.std, (8.0f64 / 3.0).sqrt()));
        assert_eq!(Summary::of([]), Summary::default());
    }
}
