//! Extractors whose failures answer with the API's JSON errors.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// A JSON body. The content type is not checked (`curl -d` sends a form
/// type); a body over the limit is `413 too_large`, anything unparsable
/// `400 invalid_request`. An empty body reads as `{}`.
pub(crate) struct ApiJson<T>(pub(crate) T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(request, state).await.map_err(body_error)?;
        let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            &bytes
        };
        serde_json::from_slice(bytes)
            .map(ApiJson)
            .map_err(|error| ApiError::InvalidRequest(format!("invalid JSON body: {error}")))
    }
}

fn body_error(rejection: BytesRejection) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::TooLarge("the request body is over the server's limit".to_owned())
    } else {
        ApiError::InvalidRequest(format!("cannot read the request body: {}", rejection.body_text()))
    }
}

/// Query parameters; unknown or malformed ones are `400 invalid_request`.
pub(crate) struct ApiQuery<T>(pub(crate) T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::try_from_uri(&parts.uri)
            .map(|axum::extract::Query(value)| ApiQuery(value))
            .map_err(|rejection| ApiError::InvalidRequest(format!("invalid query: {}", rejection.body_text())))
    }
}
