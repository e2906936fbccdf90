//! A request's body, read whole, within the size limit and the time limit between its pieces.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use futures_util::StreamExt;

use crate::error::ApiError;
use crate::{AppState, MAX_BODY};

/// The body, or the error to answer with: 413 for a body over [`MAX_BODY`], 400 for one that
/// cannot be read, 408 for one whose next piece does not arrive within
/// [`AppState::body_timeout`] (a client that sends less than its `Content-Length` would
/// otherwise hold its connection open for good).
pub struct Body(pub Result<Bytes, ApiError>);

impl FromRequest<Arc<AppState>> for Body {
    type Rejection = std::convert::Infallible;

    async fn from_request(req: Request, st: &Arc<AppState>) -> Result<Self, Self::Rejection> {
        Ok(Body(read(req, st).await))
    }
}

async fn read(req: Request, st: &AppState) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than {} MiB", MAX_BODY >> 20),
        )
    };
    let announced = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if announced.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(too_large());
    }
    let mut pieces = req.into_body().into_data_stream();
    let mut body = Vec::new();
    loop {
        match tokio::time::timeout(st.body_timeout, pieces.next()).await {
            Err(_) => {
                return Err(ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "the request body stopped arriving: nothing for {} s",
                        st.body_timeout.as_secs_f64()
                    ),
                ));
            }
            Ok(None) => return Ok(body.into()),
            Ok(Some(Err(e))) => {
                return Err(ApiError::bad_request(format!(
                    "cannot read the request body: {e}"
                )));
            }
            Ok(Some(Ok(piece))) if body.len() + piece.len() > MAX_BODY => return Err(too_large()),
            Ok(Some(Ok(piece))) => body.extend_from_slice(&piece),
        }
    }
}
