//! Authentication against real servers: JWTs minted by another
//! implementation (PyJWT, from `.ci/python/venv`), API keys made by
//! `keel keys` and over the API, their revocation on open streams, and
//! keys across several PostgreSQL nodes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

use crate::suite::support::api::{Api, Reply};
use crate::suite::support::skip;

mod cluster;
mod jwt;
mod keys;

/// Set in CI (and by `.ci/run`): the JWT tests may not be skipped for want
/// of the Python environment.
const REQUIRE: &str = "KEEL_REQUIRE_CLIENT_TESTS";

/// The virtual environment's Python, or `None` (announced) when a run may
/// skip without it.
fn python(test: &str) -> Option<PathBuf> {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/python/venv/bin/python");
    if python.is_file() {
        return Some(python);
    }
    let how = "make it: python3 -m venv .ci/python/venv; .ci/python/venv/bin/pip install --require-hashes \
               -r .ci/python/requirements.txt";
    assert!(
        skip::may_skip(REQUIRE),
        "{} is missing and this run requires it (CI or {REQUIRE}): {how}",
        python.display()
    );
    skip::announce(
        test,
        &format!("{} is missing, so JWTs are NOT tested here; {how}", python.display()),
    );
    None
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
