//! Authentication against real servers: JWTs minted by another
//! implementation (PyJWT, from `.ci/python/venv`), API keys made by
//! `keel keys` and over the API, their revocation on open streams, and
//! keys across several PostgreSQL nodes.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

use crate::suite::support::api::{Api, Reply};

mod cluster;
mod jwt;
mod keys;

/// The virtual environment's Python (PyJWT), or `None` when a run may skip.
fn python(test: &str) -> Option<PathBuf> {
    crate::suite::support::python::venv_python(test)
}

/// `api` with `credential` as its bearer.
fn with(api: &Api, credential: &str) -> Api {
    let mut api = api.clone();
    api.token = Some(credential.to_owned());
    api
}

/// `GET /v1/whoami` with `credential`.
async fn whoami(api: &Api, credential: &str) -> Reply {
    with(api, credential).get("/v1/whoami").await
}

/// Asserts `reply` is the one refusal every bad credential gets.
fn assert_unauthorized(reply: &Reply, what: &str) {
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{what}: {}", reply.body);
    assert_eq!(reply.code(), "unauthorized", "{what}");
    assert_eq!(
        reply.body["error"]["message"],
        Value::from("a valid bearer token is required"),
        "{what}: the refusal does not say which part failed"
    );
}

/// Waits until `check` holds, polling every 20 ms, and returns how long
/// it took; panics after `bound`.
async fn within<F, Fut>(bound: Duration, what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return start.elapsed();
        }
        assert!(start.elapsed() < bound, "{what} did not happen within {bound:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
