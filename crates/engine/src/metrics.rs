//! Serving metrics, shared between the engine loop and the HTTP server, rendered in the
//! Prometheus text format.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// Upper bounds (seconds) of the latency histograms' buckets.
const LATENCY_BUCKETS: [f64; 16] = [
    0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
    163.84,
];

#[derive(Debug, Clone, Default)]
struct Histogram {
    counts: [u64; LATENCY_BUCKETS.len()],
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, secs: f64) {
        if let Some(i) = LATENCY_BUCKETS.iter().position(|&b| secs <= b) {
            self.counts[i] += 1;
        }
        self.sum += secs;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (b, c) in LATENCY_BUCKETS.iter().zip(&self.counts) {
            cumulative += c;
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", self.sum, self.count);
    }
}

/// The state of the KV page pool after a step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolGauges {
    pub total: usize,
    pub used: usize,
    /// Held by the prefix cache.
    pub cached: usize,
    /// In use but held by no request and not cached: always 0 unless pages leak.
    pub leaked: usize,
    pub running: usize,
    pub waiting: usize,
}

#[derive(Debug, Default)]
struct Data {
    outcomes: BTreeMap<String, u64>,
    per_flow: BTreeMap<String, u64>,
    ttft: Histogram,
    tpot: Histogram,
    e2e: Histogram,
    queue: Histogram,
    prompt_tokens: u64,
    generation_tokens: u64,
    prefix_hit_tokens: u64,
    preemptions: u64,
    steps_ahead: u64,
    rows_dropped: u64,
    recall: Recall,
    pool: PoolGauges,
}

/// The measured recall of the pages steps selected (`vortex serve --recall-every`): sums over
/// the (layer, sequence, KV head) rows measured.
#[derive(Debug, Clone, Copy, Default)]
struct Recall {
    rows: u64,
    mass: f64,
    topk: f64,
    lowest_mass: f64,
}

/// All serving metrics. Cheap to update; rendering takes a short lock.
#[derive(Debug, Default)]
pub struct Metrics {
    data: Mutex<Data>,
}

/// Latencies of one finished request, in seconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestTimes {
    pub queue: f64,
    pub ttft: Option<f64>,
    pub tpot: Option<f64>,
    pub e2e: f64,
}

impl Metrics {
    fn with<R>(&self, f: impl FnOnce(&mut Data) -> R) -> R {
        let mut d = self.data.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut d)
    }

    /// A request ended with `outcome` (stop, length, cancelled, error, rejected).
    pub fn finished(&self, outcome: &str, times: Option<RequestTimes>) {
        self.with(|d| {
            *d.outcomes.entry(outcome.to_string()).or_default() += 1;
            if let Some(t) = times {
                d.queue.observe(t.queue);
                d.e2e.observe(t.e2e);
                if let Some(x) = t.ttft {
                    d.ttft.observe(x);
                }
                if let Some(x) = t.tpot {
                    d.tpot.observe(x);
                }
            }
        });
    }

    pub fn admitted(&self, flow: &str, prompt_tokens: usize, cached_tokens: usize) {
        self.with(|d| {
            *d.per_flow.entry(flow.to_string()).or_default() += 1;
            d.prompt_tokens += prompt_tokens as u64;
            d.prefix_hit_tokens += cached_tokens as u64;
        });
    }

    /// Prefix-cache hits of a request readmitted after preemption.
    pub fn readmitted(&self, cached_tokens: usize) {
        self.with(|d| d.prefix_hit_tokens += cached_tokens as u64);
    }

    pub fn generated(&self, tokens: usize) {
        self.with(|d| d.generation_tokens += tokens as u64);
    }

    pub fn preempted(&self) {
        self.with(|d| d.preemptions += 1);
    }

    /// A decode step queued before the host took in the last one's tokens.
    pub fn stepped_ahead(&self) {
        self.with(|d| d.steps_ahead += 1);
    }

    /// A row computed ahead for a request that had already ended.
    pub fn dropped_row(&self) {
        self.with(|d| d.rows_dropped += 1);
    }

    /// Rows of a step whose selection was measured against exact attention: `rows` of them,
    /// the sums of their mass recall and top-k recall, and the lowest mass recall.
    pub fn selection_measured(&self, rows: u64, mass_sum: f64, topk_sum: f64, lowest_mass: f64) {
        self.with(|d| {
            let r = &mut d.recall;
            r.lowest_mass = if r.rows == 0 {
                lowest_mass
            } else {
                r.lowest_mass.min(lowest_mass)
            };
            r.rows += rows;
            r.mass += mass_sum;
            r.topk += topk_sum;
        });
    }

    /// Rows measured, and their mean mass recall.
    pub fn selection_recall(&self) -> (u64, f64) {
        self.with(|d| (d.recall.rows, d.recall.mass / d.recall.rows.max(1) as f64))
    }

    pub fn steps_ahead(&self) -> u64 {
        self.with(|d| d.steps_ahead)
    }

    pub fn rows_dropped(&self) -> u64 {
        self.with(|d| d.rows_dropped)
    }

    pub fn set_pool(&self, pool: PoolGauges) {
        self.with(|d| d.pool = pool);
    }

    pub fn pool(&self) -> PoolGauges {
        self.with(|d| d.pool)
    }

    pub fn prefix_hit_tokens(&self) -> u64 {
        self.with(|d| d.prefix_hit_tokens)
    }

    /// Tokens generated by requests that have ended.
    pub fn generation_tokens(&self) -> u64 {
        self.with(|d| d.generation_tokens)
    }

    pub fn preemptions(&self) -> u64 {
        self.with(|d| d.preemptions)
    }

    /// Requests that ended with `outcome`.
    pub fn outcome(&self, outcome: &str) -> u64 {
        self.with(|d| d.outcomes.get(outcome).copied().unwrap_or(0))
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        self.with(|d| {
            let mut o = String::new();
            let counter = |o: &mut String, name: &str, help: &str, v: u64| {
                let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
            };
            let gauge = |o: &mut String, name: &str, help: &str, v: usize| {
                let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
            };
            let _ = writeln!(
                o,
                "# HELP vortex_requests_total Finished requests by outcome.\n\
                 # TYPE vortex_requests_total counter"
            );
            for (k, v) in &d.outcomes {
                let _ = writeln!(o, "vortex_requests_total{{outcome=\"{k}\"}} {v}");
            }
            let _ = writeln!(
                o,
                "# HELP vortex_flow_requests_total Admitted requests by flow.\n\
                 # TYPE vortex_flow_requests_total counter"
            );
            for (k, v) in &d.per_flow {
                let k = k.replace('\\', "\\\\").replace('"', "\\\"");
                let _ = writeln!(o, "vortex_flow_requests_total{{flow=\"{k}\"}} {v}");
            }
            d.ttft.render(
                &mut o,
                "vortex_time_to_first_token_seconds",
                "Arrival to first generated token.",
            );
            d.tpot.render(
                &mut o,
                "vortex_time_per_output_token_seconds",
                "Mean time between a request's generated tokens.",
            );
            d.e2e.render(
                &mut o,
                "vortex_e2e_request_latency_seconds",
                "Arrival to last token.",
            );
            d.queue.render(
                &mut o,
                "vortex_request_queue_time_seconds",
                "Arrival to first admission.",
            );
            counter(
                &mut o,
                "vortex_prompt_tokens_total",
                "Prompt tokens admitted.",
                d.prompt_tokens,
            );
            counter(
                &mut o,
                "vortex_generation_tokens_total",
                "Tokens generated.",
                d.generation_tokens,
            );
            counter(
                &mut o,
                "vortex_prefix_cache_hit_tokens_total",
                "Prompt tokens whose KV came from the prefix cache, at each admission: a preempted request readmitted counts its hits again (usage's cached_tokens counts the first).",
                d.prefix_hit_tokens,
            );
            counter(
                &mut o,
                "vortex_preemptions_total",
                "Requests preempted (pages freed, recomputed later).",
                d.preemptions,
            );
            counter(
                &mut o,
                "vortex_decode_steps_ahead_total",
                "Decode steps queued before the host took in the last step's tokens.",
                d.steps_ahead,
            );
            counter(
                &mut o,
                "vortex_decode_rows_dropped_total",
                "Rows computed ahead for requests that had ended on the token before.",
                d.rows_dropped,
            );
            let r = d.recall;
            if r.rows > 0 {
                for (name, help, sum) in [
                    (
                        "vortex_selection_mass_recall",
                        "Exact attention mass on the selected pages, per measured (layer, sequence, KV head) row of a sparse selection.",
                        r.mass,
                    ),
                    (
                        "vortex_selection_topk_recall",
                        "Share of the pages with the most exact attention mass that were selected, per measured row.",
                        r.topk,
                    ),
                ] {
                    let _ = writeln!(
                        o,
                        "# HELP {name} {help}\n# TYPE {name} summary\n{name}_sum {sum}\n{name}_count {}",
                        r.rows
                    );
                }
                let _ = writeln!(
                    o,
                    "# HELP vortex_selection_mass_recall_lowest The lowest mass recall of a measured row.\n\
                     # TYPE vortex_selection_mass_recall_lowest gauge\n\
                     vortex_selection_mass_recall_lowest {}",
                    r.lowest_mass
                );
            }
            let p = d.pool;
            gauge(
                &mut o,
                "vortex_requests_running",
                "Requests in the running batch.",
                p.running,
            );
            gauge(
                &mut o,
                "vortex_requests_waiting",
                "Requests waiting for admission.",
                p.waiting,
            );
            gauge(
                &mut o,
                "vortex_kv_pages_total",
                "KV pages in the pool.",
                p.total,
            );
            gauge(&mut o, "vortex_kv_pages_used", "KV pages in use.", p.used);
            gauge(
                &mut o,
                "vortex_kv_pages_cached",
                "KV pages held by the prefix cache.",
                p.cached,
            );
            gauge(
                &mut o,
                "vortex_kv_pages_leaked",
                "KV pages in use that no request or cache holds.",
                p.leaked,
            );
            o
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_gauges_and_cumulative_histograms() {
        let m = Metrics::default();
        m.finished(
            "stop",
            Some(RequestTimes {
                queue: 0.001,
                ttft: Some(0.03),
                tpot: Some(0.5),
                e2e: 1.0,
            }),
        );
        m.finished("cancelled", None);
        m.admitted("block_topk", 100, 32);
        let text = m.render();
        assert!(text.contains("vortex_requests_total{outcome=\"stop\"} 1"));
        assert!(text.contains("vortex_flow_requests_total{flow=\"block_topk\"} 1"));
        assert!(text.contains("vortex_time_to_first_token_seconds_bucket{le=\"0.02\"} 0"));
        assert!(text.contains("vortex_time_to_first_token_seconds_bucket{le=\"0.04\"} 1"));
        assert!(text.contains("vortex_time_to_first_token_seconds_bucket{le=\"+Inf\"} 1"));
        assert!(text.contains("vortex_prefix_cache_hit_tokens_total 32"));
        assert_eq!(m.outcome("cancelled"), 1);
        // Recall appears once measured.
        assert!(!text.contains("vortex_selection"));
        m.selection_measured(4, 3.6, 3.0, 0.8);
        m.selection_measured(2, 1.9, 2.0, 0.9);
        let text = m.render();
        assert!(text.contains("vortex_selection_mass_recall_sum 5.5"));
        assert!(text.contains("vortex_selection_mass_recall_count 6"));
        assert!(text.contains("vortex_selection_topk_recall_sum 5"));
        assert!(text.contains("vortex_selection_mass_recall_lowest 0.8"));
        assert_eq!(m.selection_recall().0, 6);
    }
}
