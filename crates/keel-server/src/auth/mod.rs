//! Bearer-token authentication.
//!
//! With a token configured, every `/v1/…` request and `/metrics` must carry
//! `Authorization: Bearer <token>`; the event stream and the WebSocket also
//! accept `?access_token=<token>`, since browsers cannot set headers there.
//! Tokens are compared in constant time and never logged or echoed.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::Server;
use crate::error::ApiError;

mod principal;

pub use principal::Scope;
#[allow(unused_imports)] // used as the principal grows its sources
pub(crate) use principal::{Principal, Scopes, Tenancy};

/// The server's bearer token. Its `Debug` does not show it.
#[derive(Clone)]
pub(crate) struct Token(Arc<str>);

impl Token {
    pub(crate) fn new(token: &str) -> Self {
        Self(Arc::from(token))
    }

    /// Whether `given` is the token, in time independent of where they differ.
    fn matches(&self, given: &str) -> bool {
        bool::from(self.0.as_bytes().ct_eq(given.as_bytes()))
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(…)")
    }
}

/// Middleware: lets the request through when no token is configured or the
/// request carries the token; answers `401 unauthorized` otherwise.
pub(crate) async fn require_token(State(server): State<Arc<Server>>, mut request: Request, next: Next) -> Response {
    let Some(token) = &server.token else {
        request.extensions_mut().insert(Principal::operator());
        return next.run(request).await;
    };
    let from_header = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .is_some_and(|given| token.matches(given.trim()));
    let route = request.extensions().get::<MatchedPath>().map(MatchedPath::as_str);
    let allowed = from_header || (route.is_some_and(accepts_query_token) && query_token_matches(&request, token));
    if allowed {
        request.extensions_mut().insert(Principal::operator());
        next.run(request).await
    } else {
        ApiError::Unauthorized.into_response()
    }
}

/// The routes a browser opens without being able to set headers, by their
/// pattern: a raw path such as `/v1/sessions/ws` (the session `ws`) must
/// not pass for one.
fn accepts_query_token(route: &str) -> bool {
    matches!(route, "/v1/sessions/{id}/events/stream" | "/v1/sessions/{id}/ws")
}

fn query_token_matches(request: &Request, token: &Token) -> bool {
    axum::extract::Query::<HashMap<String, String>>::try_from_uri(request.uri())
        .ok()
        .and_then(|axum::extract::Query(query)| query.get("access_token").map(|given| token.matches(given)))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_match_only_exactly_and_are_not_shown() {
        let token = Token::new("s3cret");
        assert!(token.matches("s3cret"));
        assert!(!token.matches("s3cre"));
        assert!(!token.matches("s3cret!"));
        assert!(!token.matches(""));
        assert_eq!(format!("{token:?}"), "Token(…)");
    }
}
