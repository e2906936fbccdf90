//! `vortex bench serve`: load on a running server over its OpenAI-compatible HTTP API, with
//! streaming; latency and throughput as the client sees them, per load level.

mod client;
mod dist;
mod load;
mod plot;
mod progress;
mod report;
mod runner;
mod sse;
mod stats;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use serde_json::{Map, Value, json};

use client::{list_models, stream_completion};
use dist::Dist;
use load::{Level, parse_concurrency, parse_rate};
use progress::Progress;
use report::{LevelSummary, Record};
use runner::{Jobs, Target, run_level};
use workload::{completion_body, draw_lengths, draw_prompts, parse_vocab_range};

const AFTER_HELP: &str = "\
DIST (for --input-len and --output-len) is a token count (4096, or 4k = 4096), an inclusive \
uniform range (2048:4096), or a comma list of either (128,512,1k:2k): each request picks one \
item of the list uniformly, then a count within it.

Prompts are lists of random token ids (see --vocab-range), so their length is exact without a \
tokenizer; every level draws fresh ones, so no level finds another's prompts in the prefix cache. \
Requests ask for exactly their output length (max_tokens with ignore_eos).

Examples:
  vortex bench serve --url http://127.0.0.1:8000 --rate 0.5,1,2,4,inf --num-requests 200 \\
      --input-len 2k:4k --output-len 256 --json sweep.json --plot sweep.svg
  vortex bench serve --url http://127.0.0.1:8000 --concurrency 16 --flow block_topk --budget 64";

#[derive(Args)]
#[command(after_help = AFTER_HELP)]
pub struct ServeArgs {
    /// Server address, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine).
    #[arg(long)]
    url: String,
    /// Open loop: Poisson arrivals at this many requests/s; a comma list sweeps the levels in
    /// turn (e.g. 0.5,1,2,4,inf); inf sends every request at once. The default is inf.
    #[arg(long, value_delimiter = ',', value_parser = parse_rate, conflicts_with = "concurrency")]
    rate: Vec<f64>,
    /// Closed loop: this many requests in flight, the next sent as one finishes; a comma list
    /// sweeps the levels in turn (e.g. 1,4,16).
    #[arg(long, value_delimiter = ',', value_parser = parse_concurrency)]
    concurrency: Vec<usize>,
    /// Requests sent at each level.
    #[arg(long, default_value_t = 200)]
    num_requests: usize,
    /// Prompt tokens per request (DIST, see below).
    #[arg(long, default_value = "1024", value_parser = Dist::parse)]
    input_len: Dist,
    /// Generated tokens per request (DIST, see below).
    #[arg(long, default_value = "128", value_parser = Dist::parse)]
    output_len: Dist,
    /// Tokens of one prefix shared by every request of a level, sent before its --input-len
    /// tokens (exercises the prefix cache).
    #[arg(long, default_value_t = 0)]
    shared_prefix: usize,
    /// Token ids of the prompts are drawn from LO..HI.
    #[arg(long, default_value = "1000:10000", value_parser = parse_vocab_range, value_name = "LO:HI")]
    vocab_range: (u32, u32),
    /// Model name sent in each request (default: the first one GET /v1/models lists).
    #[arg(long)]
    model: Option<String>,
    /// Sent as `Authorization: Bearer KEY`.
    #[arg(long)]
    api_key: Option<String>,
    /// Seed of the lengths, prompts and arrival times.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Sparse-attention flow of every request (the `vortex` object); absent: the server's.
    #[arg(long)]
    flow: Option<String>,
    /// Pages kept per decode step, sinks and recent pages included.
    #[arg(long)]
    budget: Option<usize>,
    /// Pages kept as a share of the sequence's pages, in (0, 1].
    #[arg(long)]
    budget_ratio: Option<f64>,
    /// First pages always kept.
    #[arg(long)]
    sinks: Option<usize>,
    /// Last pages always kept.
    #[arg(long)]
    recent: Option<usize>,
    /// Layers that always attend densely (comma-separated).
    #[arg(long, value_delimiter = ',')]
    dense_layers: Option<Vec<usize>>,
    /// Sequences shorter than this many tokens attend densely.
    #[arg(long)]
    min_context: Option<usize>,
    /// Share of the exact top pages approximate top-k may miss, in [0, 1).
    #[arg(long)]
    tolerance: Option<f64>,
    /// More fields of the `vortex` object, as a JSON object (over the flags above).
    #[arg(long, value_name = "JSON")]
    vortex: Option<String>,
    /// Fields added to every request body, as a JSON object (e.g. '{"temperature":0}').
    #[arg(long, value_name = "JSON")]
    extra_body: Option<String>,
    /// Give up on a request after this many seconds (default: never).
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<f64>,
    /// Stop sending new requests this many seconds into each level (those in flight finish);
    /// --num-requests is then an upper bound. For soak runs.
    #[arg(long, value_name = "SECONDS")]
    duration: Option<f64>,
    /// Write the summary of each level and every request's record here, as JSON.
    #[arg(long, value_name = "OUT")]
    json: Option<PathBuf>,
    /// Write an SVG plot here: throughput and latency against the level for a sweep, latency
    /// distributions for a single level.
    #[arg(long, value_name = "OUT.svg")]
    plot: Option<PathBuf>,
}

/// `http://host:port` from what the user typed: a trailing `/`, `/v1` or `/v1/completions` goes.
fn base_url(url: &str) -> Result<String, String> {
    let parsed =
        reqwest::Url::parse(url.trim()).map_err(|e| format!("--url '{url}' is not a URL: {e}"))?;
    match parsed.scheme() {
        "http" => {}
        "https" => {
            return Err(format!(
                "--url '{url}': https is not supported; give the server's http address"
            ));
        }
        other => return Err(format!("--url '{url}': unsupported scheme '{other}'")),
    }
    let mut base = parsed.as_str().trim_end_matches('/').to_string();
    for suffix in ["/v1/completions", "/v1"] {
        if let Some(b) = base.strip_suffix(suffix) {
            base = b.to_string();
            break;
        }
    }
    Ok(base)
}

fn json_object(flag: &str, text: &str) -> Result<Map<String, Value>, String> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(format!("{flag} must be a JSON object")),
        Err(e) => Err(format!("{flag}: bad JSON: {e}")),
    }
}

impl ServeArgs {
    fn levels(&self) -> Vec<Level> {
        if !self.concurrency.is_empty() {
            self.concurrency
                .iter()
                .map(|&c| Level::Concurrency(c))
                .collect()
        } else if !self.rate.is_empty() {
            self.rate.iter().map(|&r| Level::Rate(r)).collect()
        } else {
            vec![Level::Rate(f64::INFINITY)]
        }
    }

    /// The `vortex` object of every request, if any flag asks for one.
    fn vortex_object(&self) -> Result<Option<Value>, String> {
        let mut m = Map::new();
        if let Some(f) = &self.flow {
            m.insert("flow".into(), json!(f));
        }
        if let Some(b) = self.budget {
            m.insert("budget".into(), json!(b));
        }
        // JSON has no NaN or infinity: serde_json would send null, which means "not set".
        for (flag, v) in [
            ("--budget-ratio", self.budget_ratio),
            ("--tolerance", self.tolerance),
        ] {
            if v.is_some_and(|v| !v.is_finite()) {
                return Err(format!("{flag} must be a finite number"));
            }
        }
        if let Some(r) = self.budget_ratio {
            m.insert("budget_ratio".into(), json!(r));
        }
        if let Some(s) = self.sinks {
            m.insert("sinks".into(), json!(s));
        }
        if let Some(r) = self.recent {
            m.insert("recent".into(), json!(r));
        }
        if let Some(l) = &self.dense_layers {
            m.insert("dense_layers".into(), json!(l));
        }
        if let Some(c) = self.min_context {
            m.insert("min_context".into(), json!(c));
        }
        if let Some(t) = self.tolerance {
            m.insert("tolerance".into(), json!(t));
        }
        if let Some(text) = &self.vortex {
            m.extend(json_object("--vortex", text)?);
        }
        Ok((!m.is_empty()).then_some(Value::Object(m)))
    }
}

pub fn run(args: ServeArgs) -> Result<ExitCode, String> {
    if args.num_requests == 0 {
        return Err("--num-requests must be at least 1".into());
    }
    // A day is past any run; a Duration cannot hold much more than that many seconds anyway.
    const MAX_SECONDS: f64 = 86_400.0;
    for (flag, value) in [("--timeout", args.timeout), ("--duration", args.duration)] {
        if let Some(t) = value
            && !(t > 0.0 && t <= MAX_SECONDS)
        {
            return Err(format!(
                "{flag} must be a positive number of seconds, at most {MAX_SECONDS}"
            ));
        }
    }
    let longest = args.shared_prefix.saturating_add(args.input_len.max());
    crate::limits::check_memory(
        &format!("{} prompts of up to {longest} tokens", args.num_requests),
        args.num_requests
            .checked_mul(longest)
            .and_then(|t| t.checked_mul(4)),
    )?;
    let base = base_url(&args.url)?;
    let vortex = args.vortex_object()?;
    let extra = match &args.extra_body {
        Some(text) => json_object("--extra-body", text)?,
        None => Map::new(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    runtime.block_on(bench(args, base, vortex, extra))
}

async fn bench(
    args: ServeArgs,
    base: String,
    vortex: Option<Value>,
    extra: Map<String, Value>,
) -> Result<ExitCode, String> {
    let mut builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .tcp_nodelay(true);
    if let Some(t) = args.timeout {
        builder = builder.timeout(Duration::from_secs_f64(t));
    }
    let client = builder
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
    let api_key = args.api_key.clone();
    let model = match &args.model {
        Some(m) => m.clone(),
        None => list_models(&client, &base, api_key.as_deref())
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| format!("{base}/v1/models lists no model; give --model"))?,
    };
    let target = Arc::new(Target {
        client,
        url: format!("{base}/v1/completions"),
        api_key,
        model,
        vortex,
        extra,
    });

    // One short request first, so a bad address, model or flow fails at once and clearly.
    let lo = args.vocab_range.0;
    let probe: Vec<u32> = (lo..lo.saturating_add(8))
        .map(|t| t.min(args.vocab_range.1 - 1))
        .collect();
    let body = completion_body(
        &target.model,
        &probe,
        2,
        target.vortex.as_ref(),
        &target.extra,
    );
    let test = stream_completion(
        &target.client,
        &target.url,
        target.api_key.as_deref(),
        &body,
    )
    .await;
    if let Some(e) = test.error {
        return Err(format!("test request to {} failed: {e}", target.url));
    }

    let levels = args.levels();
    let n = args.num_requests;
    let flow_note = match &target.vortex {
        Some(v) => format!(", vortex {v}"),
        None => String::new(),
    };
    let prefix_note = if args.shared_prefix > 0 {
        format!(" after a shared prefix of {}", args.shared_prefix)
    } else {
        String::new()
    };
    println!(
        "{} model {}: {n} requests per level, input {}{prefix_note}, output {} tokens{flow_note}",
        target.url, target.model, args.input_len, args.output_len
    );
    println!("{}", report::main_header());

    let lengths = draw_lengths(n, &args.input_len, &args.output_len, args.seed);
    let mut done: Vec<(Level, LevelSummary, Vec<Record>)> = Vec::new();
    for (li, &level) in levels.iter().enumerate() {
        let li = li as u64 + 1;
        let jobs = Arc::new(Jobs {
            prompts: draw_prompts(
                &lengths,
                args.shared_prefix,
                args.vocab_range,
                args.seed.wrapping_add(li.wrapping_mul(0x9e37_79b9)),
            ),
            max_tokens: lengths.iter().map(|l| l.output).collect(),
        });
        let progress = Arc::new(Progress::new(level.to_string(), n));
        let ticker = {
            let p = progress.clone();
            tokio::spawn(async move { p.run().await })
        };
        let schedule_seed = args.seed.wrapping_add(li.wrapping_mul(0x85eb_ca6b));
        let (records, secs) = run_level(
            target.clone(),
            jobs,
            level,
            schedule_seed,
            progress.clone(),
            args.duration.map(Duration::from_secs_f64),
        )
        .await;
        ticker.abort();
        progress.close();
        let summary = LevelSummary::new(level, &records, secs);
        println!("{}", report::main_row(&summary));
        done.push((level, summary, records));
        write_outputs(&args, &target, &done)?;
    }
    let summaries: Vec<LevelSummary> = done.iter().map(|(_, s, _)| s.clone()).collect();
    println!();
    print!("{}", report::latency_table(&summaries));
    for s in &summaries {
        if s.short_outputs > 0 {
            eprintln!(
                "{}: {} requests generated fewer tokens than asked (does the server honour ignore_eos?)",
                s.level, s.short_outputs
            );
        }
        let mut errors: Vec<(&String, &usize)> = s.error_counts.iter().collect();
        errors.sort_by(|a, b| b.1.cmp(a.1));
        for (msg, count) in errors.iter().take(3) {
            eprintln!("{}: {count} x {msg}", s.level);
        }
    }
    if summaries.iter().all(|s| s.completed == 0) {
        return Err("every request failed".into());
    }
    Ok(ExitCode::SUCCESS)
}

fn write_outputs(
    args: &ServeArgs,
    target: &Target,
    done: &[(Level, LevelSummary, Vec<Record>)],
) -> Result<(), String> {
    if let Some(path) = &args.json {
        let levels: Vec<Value> = done
            .iter()
            .map(|(_, s, r)| {
                let mut v = serde_json::to_value(s).unwrap_or(Value::Null);
                v["records"] = serde_json::to_value(r).unwrap_or(Value::Null);
                v
            })
            .collect();
        let doc = json!({
            "url": target.url,
            "model": target.model,
            "num_requests": args.num_requests,
            "input_len": args.input_len.to_string(),
            "output_len": args.output_len.to_string(),
            "shared_prefix": args.shared_prefix,
            "vocab_range": [args.vocab_range.0, args.vocab_range.1],
            "seed": args.seed,
            "vortex": target.vortex,
            "extra_body": target.extra,
            "levels": levels,
        });
        let text = serde_json::to_string(&doc).map_err(|e| e.to_string())? + "\n";
        std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        let mut title = format!(
            "{}: input {}, output {} tokens",
            target.model, args.input_len, args.output_len
        );
        if let Some(Value::Object(v)) = &target.vortex
            && let Some(f) = v.get("flow").and_then(Value::as_str)
        {
            title.push_str(&format!(", flow {f}"));
        }
        let svg = report::plot(&title, done);
        std::fs::write(path, svg).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(base_url("http://h:8000").unwrap(), "http://h:8000");
        assert_eq!(base_url("http://h:8000/").unwrap(), "http://h:8000");
        assert_eq!(base_url("http://h:8000/v1").unwrap(), "http://h:8000");
        assert_eq!(
            base_url("http://h:8000/v1/completions").unwrap(),
            "http://h:8000"
        );
        assert!(base_url("h:8000").is_err());
        assert!(base_url("not a url").is_err());
        assert!(base_url("https://h").unwrap_err().contains("https"));
    }

    #[test]
    fn json_flags() {
        assert!(json_object("--x", "[1]").is_err());
        assert!(json_object("--x", "{").is_err());
        assert_eq!(json_object("--x", r#"{"a":1}"#).unwrap()["a"], 1);
    }
}
