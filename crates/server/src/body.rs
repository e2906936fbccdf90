//! A request's body, read whole within the server's time limit.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;

use crate::AppState;
use crate::error::ApiError;

/// The body, or the error to answer with: a body over the size limit, one that cannot be read,
/// or one that does not arrive in full within [`AppState::body_timeout`] (a client that sends
/// less than its `Content-Length` would otherwise hold its connection open for good).
pub struct Body(pub Result<Bytes, ApiError>);

impl FromRequest<Arc<AppState>> for Body {
    type Rejection = std::convert::Infallible;

    async fn from_request(req: Request, st: &Arc<AppState>) -> Result<Self, Self::Rejection> {
        let read = Bytes::from_request(req, st);
        Ok(Body(
            match tokio::time::timeout(st.body_timeout, read).await {
                Ok(Ok(bytes)) => Ok(bytes),
                Ok(Err(e)) => Err(ApiError::new(e.status(), e.body_text())),
                Err(_) => Err(ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "the request body did not arrive in full within {} s",
                        st.body_timeout.as_secs_f64()
                    ),
                )),
            },
        ))
    }
}
