//! Runs one load level: sends the requests on their schedule (open loop) or keeps a number of
//! them in flight (closed loop), and collects a record for each.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use reqwest::Client;
use serde_json::{Map, Value};
use tokio::time::Instant;

use super::client::stream_completion;
use super::load::{Level, poisson_schedule};
use super::progress::Progress;
use super::report::Record;
use super::workload::completion_body;

/// What every request of a run shares.
pub struct Target {
    pub client: Client,
    /// The full `/v1/completions` address.
    pub url: String,
    pub api_key: Option<String>,
    pub model: String,
    pub vortex: Option<Value>,
    pub extra: Map<String, Value>,
}

/// The requests of one level.
pub struct Jobs {
    pub prompts: Vec<Vec<u32>>,
    pub max_tokens: Vec<usize>,
}

async fn one(
    target: &Target,
    jobs: &Jobs,
    i: usize,
    start: Instant,
    progress: &Progress,
) -> Record {
    let body = completion_body(
        &target.model,
        &jobs.prompts[i],
        jobs.max_tokens[i],
        target.vortex.as_ref(),
        &target.extra,
    );
    let sent = start.elapsed().as_secs_f64();
    progress.sent();
    let outcome = stream_completion(
        &target.client,
        &target.url,
        target.api_key.as_deref(),
        &body,
    )
    .await;
    progress.finished(outcome.error.is_none());
    Record::new(i, jobs.prompts[i].len(), jobs.max_tokens[i], sent, &outcome)
}

/// Runs every job at `level`; returns the records in job order and the level's wall time.
pub async fn run_level(
    target: Arc<Target>,
    jobs: Arc<Jobs>,
    level: Level,
    seed: u64,
    progress: Arc<Progress>,
    duration: Option<Duration>,
) -> (Vec<Record>, f64) {
    let n = jobs.prompts.len();
    let start = Instant::now();
    // Past the duration no new request is sent; those in flight finish.
    let open = move || duration.is_none_or(|d| start.elapsed() < d);
    let mut tasks = Vec::new();
    match level {
        Level::Rate(rate) => {
            for (i, t) in poisson_schedule(n, rate, seed).into_iter().enumerate() {
                // A slow rate's arrivals can lie past any time there is: none is sent then.
                let Some(at) = Duration::try_from_secs_f64(t)
                    .ok()
                    .and_then(|d| start.checked_add(d))
                else {
                    break;
                };
                // An arrival past the duration is not waited for: the level ends at it.
                if duration.is_some_and(|d| at.duration_since(start) >= d) {
                    break;
                }
                tokio::time::sleep_until(at).await;
                if !open() {
                    break;
                }
                let (target, jobs, progress) = (target.clone(), jobs.clone(), progress.clone());
                tasks.push(tokio::spawn(async move {
                    vec![one(&target, &jobs, i, start, &progress).await]
                }));
            }
        }
        Level::Concurrency(c) => {
            let next = Arc::new(AtomicUsize::new(0));
            for _ in 0..c.min(n) {
                let (target, jobs, progress) = (target.clone(), jobs.clone(), progress.clone());
                let next = next.clone();
                tasks.push(tokio::spawn(async move {
                    let mut done = Vec::new();
                    loop {
                        if !open() {
                            break done;
                        }
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            break done;
                        }
                        done.push(one(&target, &jobs, i, start, &progress).await);
                    }
                }));
            }
        }
    }
    let mut records = Vec::with_capacity(n);
    for task in tasks {
        // A task only fails by panicking; its requests then have no record.
        if let Ok(done) = task.await {
            records.extend(done);
        }
    }
    let duration = start.elapsed().as_secs_f64();
    records.sort_by_key(|r| r.index);
    (records, duration)
}
