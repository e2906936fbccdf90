//! Load levels and arrival schedules: Poisson arrivals at a request rate (open loop), or a fixed
//! number of requests in flight (closed loop).

use std::fmt;

use rand::{Rng, SeedableRng, rngs::StdRng};

/// One load level of a run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Level {
    /// Poisson arrivals at this many requests per second; infinite sends everything at once.
    Rate(f64),
    /// Closed loop: this many requests in flight, the next one sent when one finishes.
    Concurrency(usize),
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Level::Rate(r) if r.is_infinite() => f.write_str("rate=inf"),
            Level::Rate(r) => write!(f, "rate={r}"),
            Level::Concurrency(c) => write!(f, "conc={c}"),
        }
    }
}

impl Level {
    /// The level's value as a short label for tables and plots (`2`, `inf`, `16`).
    pub fn value_label(&self) -> String {
        match *self {
            Level::Rate(r) if r.is_infinite() => "inf".into(),
            Level::Rate(r) => format!("{r}"),
            Level::Concurrency(c) => format!("{c}"),
        }
    }
}

/// Parses one `--rate` value: a positive number of requests per second, or `inf`.
pub fn parse_rate(s: &str) -> Result<f64, String> {
    let t = s.trim().to_ascii_lowercase();
    if t == "inf" || t == "infinity" {
        return Ok(f64::INFINITY);
    }
    match t.parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        _ => Err(format!(
            "'{s}' is not a request rate: give a positive number of requests/s or 'inf'"
        )),
    }
}

/// Parses one `--concurrency` value: a positive number of requests in flight.
pub fn parse_concurrency(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(c) if c > 0 => Ok(c),
        _ => Err(format!(
            "'{s}' is not a concurrency: give a positive integer"
        )),
    }
}

/// Send times in seconds from the start of a level for `n` Poisson arrivals at `rate` requests/s:
/// exponential gaps with mean `1 / rate`, the first request at 0. An infinite rate sends all at 0.
pub fn poisson_schedule(n: usize, rate: f64, seed: u64) -> Vec<f64> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut t = 0.0;
    (0..n)
        .map(|i| {
            if i > 0 && rate.is_finite() {
                // 1 - u lies in (0, 1], so the logarithm is finite.
                let u: f64 = rng.random();
                t += -(1.0 - u).ln() / rate;
            }
            t
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("2.5").unwrap(), 2.5);
        assert!(parse_rate("inf").unwrap().is_infinite());
        assert!(parse_rate("INF").unwrap().is_infinite());
        for bad in ["0", "-1", "nan", "x", "", "1e400"] {
            assert!(parse_rate(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_concurrency("8").unwrap(), 8);
        assert!(parse_concurrency("0").is_err());
        assert!(parse_concurrency("-2").is_err());
    }

    #[test]
    fn poisson_mean_gap_matches_rate() {
        let n = 20_000;
        let rate = 4.0;
        let t = poisson_schedule(n, rate, 42);
        assert_eq!(t[0], 0.0);
        assert!(t.windows(2).all(|w| w[1] >= w[0]));
        let mean_gap = t[n - 1] / (n - 1) as f64;
        assert!((mean_gap - 0.25).abs() < 0.25 * 0.03, "{mean_gap}");
        // Exponential gaps: the standard deviation equals the mean.
        let gaps: Vec<f64> = t.windows(2).map(|w| w[1] - w[0]).collect();
        let var = gaps.iter().map(|g| (g - mean_gap).powi(2)).sum::<f64>() / gaps.len() as f64;
        assert!((var.sqrt() / mean_gap - 1.0).abs() < 0.05);
        // Same seed, same schedule; another seed, another one.
        assert_eq!(t, poisson_schedule(n, rate, 42));
        assert_ne!(t, poisson_schedule(n, rate, 43));
    }

    #[test]
    fn infinite_rate_sends_at_once() {
        assert!(
            poisson_schedule(5, f64::INFINITY, 1)
                .iter()
                .all(|&t| t == 0.0)
        );
        assert!(poisson_schedule(0, 1.0, 1).is_empty());
    }
}
