//! How many requests the server holds at once (`--max-requests`): past the limit a request is
//! turned away with a 503 and `Retry-After` instead of waiting without bound.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// The requests in flight, and how many may be.
#[derive(Debug, Default)]
pub struct Admission {
    limit: Option<usize>,
    held: Arc<AtomicUsize>,
}

/// One admitted request's place, given back when it drops (the response is complete or the
/// client has left).
#[derive(Debug)]
pub struct Ticket(Arc<AtomicUsize>);

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Admission {
    /// At most `limit` requests at once (`None`: any number).
    pub fn new(limit: Option<usize>) -> Self {
        Self {
            limit,
            held: Arc::default(),
        }
    }

    /// Requests in flight now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// A place for one more request, or [`Full`] with the requests held.
    pub fn admit(&self) -> Result<Ticket, Full> {
        let limit = self.limit.unwrap_or(usize::MAX);
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .map(|_| Ticket(self.held.clone()))
            .map_err(Full)
    }
}

/// The server held its limit of requests: a 503 that says when to try again.
#[derive(Debug)]
pub struct Full(pub usize);

impl IntoResponse for Full {
    fn into_response(self) -> Response {
        let mut r = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the server holds {} requests, its limit (--max-requests); try again",
                self.0
            ),
        )
        .into_response();
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        r
    }
}
