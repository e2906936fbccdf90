//! Per-request records, the summary of a level, the tables and the plot.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::client::Outcome;
use super::load::Level;
use super::plot::{Panel, Series, XAxis, cdf_points, render};
use super::stats::Summary;

/// One request as measured on the client. Times in milliseconds.
#[derive(Clone, Debug, Serialize)]
pub struct Record {
    pub index: usize,
    /// Tokens in the prompt sent.
    pub prompt_len: usize,
    /// `max_tokens` asked for.
    pub max_tokens: usize,
    /// When it was sent, from the start of the level, in seconds.
    pub sent_s: f64,
    pub ok: bool,
    pub status: Option<u16>,
    pub error: Option<String>,
    /// From the usage chunk.
    pub prompt_tokens: Option<u64>,
    /// From the usage chunk, else the number of chunks with text.
    pub completion_tokens: u64,
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2e_ms: f64,
    /// Gaps between chunks with text.
    pub itl_ms: Vec<f64>,
}

/// Milliseconds from seconds, kept to the microsecond.
fn ms(seconds: f64) -> f64 {
    (seconds * 1e6).round() / 1e3
}

impl Record {
    pub fn new(
        index: usize,
        prompt_len: usize,
        max_tokens: usize,
        sent_s: f64,
        o: &Outcome,
    ) -> Record {
        let ok = o.error.is_none();
        let completion_tokens = o
            .usage
            .map_or(o.chunk_times.len() as u64, |(_, completion)| completion);
        let ttft = o.ttft();
        let tpot = match ttft {
            Some(t) if ok && completion_tokens > 1 => {
                Some(ms((o.e2e - t) / (completion_tokens - 1) as f64))
            }
            _ => None,
        };
        Record {
            index,
            prompt_len,
            max_tokens,
            sent_s: (sent_s * 1e6).round() / 1e6,
            ok,
            status: o.status,
            error: o.error.clone(),
            prompt_tokens: o.usage.map(|(p, _)| p),
            completion_tokens,
            ttft_ms: ttft.map(ms),
            tpot_ms: tpot,
            e2e_ms: o.e2e * 1e3,
            itl_ms: o
                .chunk_times
                .windows(2)
                .map(|w| (w[1] - w[0]) * 1e3)
                .collect(),
        }
    }
}

/// The summary of one load level, over the requests that succeeded.
#[derive(Clone, Debug, Serialize)]
pub struct LevelSummary {
    pub level: String,
    /// Offered requests/s: a number, `"inf"`, or null for a closed loop.
    pub rate: Value,
    pub concurrency: Option<usize>,
    pub requests: usize,
    pub completed: usize,
    pub errors: usize,
    /// Requests that generated fewer tokens than asked for.
    pub short_outputs: usize,
    pub duration_s: f64,
    pub request_throughput: f64,
    pub input_throughput: f64,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    pub total_input_tokens: u64,
    pub total_output_tokens: u64,
    pub ttft_ms: Summary,
    pub tpot_ms: Summary,
    pub itl_ms: Summary,
    pub e2e_ms: Summary,
    /// Each distinct error message and how often it came.
    pub error_counts: BTreeMap<String, usize>,
}

impl LevelSummary {
    pub fn new(level: Level, records: &[Record], duration_s: f64) -> LevelSummary {
        let ok: Vec<&Record> = records.iter().filter(|r| r.ok).collect();
        let mut error_counts = BTreeMap::new();
        for r in records {
            if let Some(e) = &r.error {
                *error_counts.entry(e.clone()).or_insert(0) += 1;
            }
        }
        let input: u64 = ok
            .iter()
            .map(|r| r.prompt_tokens.unwrap_or(r.prompt_len as u64))
            .sum();
        let output: u64 = ok.iter().map(|r| r.completion_tokens).sum();
        let per_s = |x: f64| {
            if duration_s > 0.0 {
                x / duration_s
            } else {
                0.0
            }
        };
        let (rate, concurrency) = match level {
            Level::Rate(r) if r.is_infinite() => (Value::from("inf"), None),
            Level::Rate(r) => (Value::from(r), None),
            Level::Concurrency(c) => (Value::Null, Some(c)),
        };
        LevelSummary {
            level: level.to_string(),
            rate,
            concurrency,
            requests: records.len(),
            completed: ok.len(),
            errors: records.len() - ok.len(),
            short_outputs: ok
                .iter()
                .filter(|r| (r.completion_tokens as usize) < r.max_tokens)
                .count(),
            duration_s,
            request_throughput: per_s(ok.len() as f64),
            input_throughput: per_s(input as f64),
            output_throughput: per_s(output as f64),
            total_token_throughput: per_s((input + output) as f64),
            total_input_tokens: input,
            total_output_tokens: output,
            ttft_ms: Summary::of(ok.iter().filter_map(|r| r.ttft_ms)),
            tpot_ms: Summary::of(ok.iter().filter_map(|r| r.tpot_ms)),
            itl_ms: Summary::of(ok.iter().flat_map(|r| r.itl_ms.iter().copied())),
            e2e_ms: Summary::of(ok.iter().map(|r| r.e2e_ms)),
            error_counts,
        }
    }
}

/// The first table: throughput, TTFT and TPOT, one row per level.
pub fn main_header() -> String {
    let t = format!(
        "{:<12} {:>5} {:>5} {:>7} {:>9} | {:^35} | {:^35}\n{:<12} {:>5} {:>5} {:>7} {:>9} | {:>8} {:>8} {:>8} {:>8} | {:>8} {:>8} {:>8} {:>8}",
        "",
        "",
        "",
        "",
        "",
        "TTFT (ms)",
        "TPOT (ms)",
        "level",
        "ok",
        "errs",
        "req/s",
        "out tok/s",
        "mean",
        "p50",
        "p95",
        "p99",
        "mean",
        "p50",
        "p95",
        "p99"
    );
    t.lines().map(str::trim_end).collect::<Vec<_>>().join("\n")
}

pub fn main_row(s: &LevelSummary) -> String {
    format!(
        "{:<12} {:>5} {:>5} {:>7.2} {:>9.1} | {} | {}",
        s.level,
        s.completed,
        s.errors,
        s.request_throughput,
        s.output_throughput,
        quad(&s.ttft_ms),
        quad(&s.tpot_ms)
    )
}

/// The second table: inter-token and end-to-end latency.
pub fn latency_table(levels: &[LevelSummary]) -> String {
    let t = format!(
        "{:<12} | {:^35} | {:^35}\n{:<12} | {:>8} {:>8} {:>8} {:>8} | {:>8} {:>8} {:>8} {:>8}\n",
        "",
        "ITL (ms)",
        "E2E latency (ms)",
        "level",
        "mean",
        "p50",
        "p95",
        "p99",
        "mean",
        "p50",
        "p95",
        "p99"
    );
    let mut t: String = t.lines().map(|l| format!("{}\n", l.trim_end())).collect();
    for s in levels {
        t.push_str(&format!(
            "{:<12} | {} | {}\n",
            s.level,
            quad(&s.itl_ms),
            quad(&s.e2e_ms)
        ));
    }
    t
}

fn quad(s: &Summary) -> String {
    if s.count == 0 {
        return format!("{:>8} {:>8} {:>8} {:>8}", "-", "-", "-", "-");
    }
    format!(
        "{:>8.1} {:>8.1} {:>8.1} {:>8.1}",
        s.mean, s.p50, s.p95, s.p99
    )
}

/// A sweep plots throughput and latency percentiles against the level; a single level plots the
/// distributions of TTFT and of TPOT with inter-token latency.
pub fn plot(title: &str, levels: &[(Level, LevelSummary, Vec<Record>)]) -> String {
    if let [(_, _, records)] = levels {
        let ok = || records.iter().filter(|r| r.ok);
        let ttft: Vec<f64> = ok().filter_map(|r| r.ttft_ms).collect();
        let tpot: Vec<f64> = ok().filter_map(|r| r.tpot_ms).collect();
        let itl: Vec<f64> = ok().flat_map(|r| r.itl_ms.iter().copied()).collect();
        let cdf = |title: &str, series: Vec<Series>| Panel {
            title: title.into(),
            x_label: "milliseconds".into(),
            y_label: "share of requests (CDF)".into(),
            x_axis: XAxis::Numeric,
            y_from_zero: true,
            y_max: Some(1.0),
            markers: false,
            series,
        };
        let line = |name: &str, v: &[f64], dashed| Series {
            name: name.into(),
            points: cdf_points(v, 1000),
            dashed,
        };
        let mut itl_panel = cdf(
            "TPOT and inter-token latency",
            vec![line("TPOT", &tpot, false)],
        );
        itl_panel
            .series
            .push(line("ITL (share of gaps)", &itl, true));
        return render(
            title,
            &[
                cdf("Time to first token", vec![line("TTFT", &ttft, false)]),
                itl_panel,
            ],
        );
    }
    let names: Vec<String> = levels.iter().map(|(l, _, _)| l.value_label()).collect();
    let x_label = match levels.first() {
        Some((Level::Concurrency(_), _, _)) => "concurrency (requests in flight)",
        _ => "offered rate (requests/s)",
    };
    let series = |name: &str, f: &dyn Fn(&LevelSummary) -> (u64, f64), dashed| Series {
        name: name.into(),
        points: levels
            .iter()
            .enumerate()
            .filter_map(|(i, (_, s, _))| {
                let (count, v) = f(s);
                (count > 0).then_some((i as f64, v))
            })
            .collect(),
        dashed,
    };
    let panel = |title: &str, y: &str, series: Vec<Series>| Panel {
        title: title.into(),
        x_label: x_label.into(),
        y_label: y.into(),
        x_axis: XAxis::Categories(names.clone()),
        y_from_zero: true,
        y_max: None,
        markers: true,
        series,
    };
    let n = |s: &Summary| s.count as u64;
    render(
        title,
        &[
            panel(
                "Throughput",
                "output tokens/s",
                vec![series(
                    "output tokens/s",
                    &|s| (s.completed as u64, s.output_throughput),
                    false,
                )],
            ),
            panel(
                "Time to first token",
                "milliseconds",
                vec![
                    series("P95 TTFT", &|s| (n(&s.ttft_ms), s.ttft_ms.p95), false),
                    series("P50 TTFT", &|s| (n(&s.ttft_ms), s.ttft_ms.p50), true),
                ],
            ),
            panel(
                "Time per output token",
                "milliseconds",
                vec![
                    series("P95 TPOT", &|s| (n(&s.tpot_ms), s.tpot_ms.p95), false),
                    series("P50 TPOT", &|s| (n(&s.tpot_ms), s.tpot_ms.p50), true),
                ],
            ),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(times: &[f64], e2e: f64, usage: Option<(u64, u64)>) -> Outcome {
        Outcome {
            status: Some(200),
            error: None,
            chunk_times: times.to_vec(),
            e2e,
            usage,
        }
    }

    #[test]
    fn record_timings() {
        let r = Record::new(
            0,
            10,
            4,
            0.0,
            &outcome(&[0.1, 0.2, 0.25, 0.4], 0.4, Some((10, 4))),
        );
        assert!((r.ttft_ms.unwrap() - 100.0).abs() < 1e-9);
        assert!((r.tpot_ms.unwrap() - 100.0).abs() < 1e-9);
        assert_eq!(r.itl_ms.len(), 3);
        assert!((r.itl_ms[1] - 50.0).abs() < 1e-9);
        // No usage chunk: tokens counted from chunks; one token has no TPOT.
        let r = Record::new(1, 10, 1, 0.0, &outcome(&[0.1], 0.1, None));
        assert_eq!(r.completion_tokens, 1);
        assert_eq!(r.tpot_ms, None);
        let mut failed = outcome(&[], 0.01, None);
        failed.error = Some("HTTP 400: bad flow".into());
        let bad = Record::new(2, 10, 4, 0.0, &failed);
        assert!(!bad.ok && bad.ttft_ms.is_none());

        let recs = vec![
            Record::new(
                0,
                10,
                4,
                0.0,
                &outcome(&[0.1, 0.2, 0.3, 0.4], 0.4, Some((10, 4))),
            ),
            Record::new(1, 10, 4, 0.5, &outcome(&[0.3, 0.4], 0.6, Some((10, 2)))),
            bad,
        ];
        let s = LevelSummary::new(Level::Rate(2.0), &recs, 2.0);
        assert_eq!((s.completed, s.errors, s.short_outputs), (2, 1, 1));
        assert_eq!((s.total_input_tokens, s.total_output_tokens), (20, 6));
        assert!((s.output_throughput - 3.0).abs() < 1e-9);
        assert!((s.request_throughput - 1.0).abs() < 1e-9);
        assert!((s.ttft_ms.mean - 200.0).abs() < 1e-9);
        assert_eq!(s.error_counts["HTTP 400: bad flow"], 1);
        assert_eq!(s.rate, Value::from(2.0));
        assert!(main_row(&s).starts_with("rate=2"));
        assert!(latency_table(&[s]).contains("rate=2"));
    }
}
