//! API keys against a real `keel serve`: made by `keel keys` and over the
//! API, revoked (open streams included) and expired.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{assert_unauthorized, whoami, with, within};
use crate::suite::support::api::Api;
use crate::suite::support::server::{Scratch, ServeProcess};
use crate::suite::support::wait::guard;

/// How soon a change of keys must be enforced (the issue's bound).
const ENFORCED_WITHIN: Duration = Duration::from_secs(1);

/// Runs `keel keys ARGS --db DB`.
pub(super) fn keel_keys(db: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("keys")
        .args(args)
        .args(["--db", db])
        .env_remove("KEEL_DB")
        .env("KEEL_LOG", "warn")
        .output()
        .expect("run keel keys")
}

/// `keel keys create` with `--json`: the key and its record.
pub(super) fn create_key(db: &str, tenant: &str, name: &str, scopes: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "create", "--tenant", tenant, "--name", name, "--scopes", scopes, "--json",
    ];
    args.extend_from_slice(extra);
    let output = keel_keys(db, &args);
    assert!(
        output.status.success(),
        "keel keys create: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the key as JSON")
}

/// `keel keys revoke ID`.
pub(super) fn revoke_key(db: &str, id: &str) {
    let output = keel_keys(db, &["revoke", id]);
    assert!(
        output.status.success(),
        "keel keys revoke: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Waits until `key` is the key's principal on `api` (not the operator
/// that a loopback server without a token took every request for before
/// it had keys).
async fn key_works(api: &Api, key: &str) {
    within(ENFORCED_WITHIN * 2, "the new key working", || async {
        whoami(api, key).await.body["kind"] == "api_key"
    })
    .await;
}

/// Reads an event stream until the server ends it; returns when.
async fn until_sse_ends(response: reqwest::Response) -> Instant {
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        if chunk.is_err() {
            break;
        }
    }
    Instant::now()
}

/// Reads a WebSocket until the server closes it; returns when.
async fn until_ws_closes(url: String) -> Instant {
    let (mut socket, _) = tokio_tungstenite::connect_async(url)
        .await
        .expect("connect the WebSocket");
    while let Some(frame) = socket.next().await {
        match frame {
            Ok(tokio_tungstenite::tungstenite::Message::Close(_)) | Err(_) => break,
            Ok(_) => {}
        }
    }
    Instant::now()
}

/// Opens a stream and a WebSocket of `session` with `key`, each watched
/// until the server ends it.
pub(super) async fn open_streams(api: &Api, key: &str, session: &str) -> [tokio::task::JoinHandle<Instant>; 2] {
    let response = with(api, key)
        .client
        .get(api.url(&format!("/v1/sessions/{session}/events/stream")))
        .bearer_auth(key)
        .send()
        .await
        .expect("open the stream");
    assert_eq!(response.status(), StatusCode::OK);
    let sse = tokio::spawn(until_sse_ends(response));
    // The WebSocket with the key in the query, as a browser sends it.
    let url = format!(
        "{}/v1/sessions/{session}/ws?access_token={key}",
        api.base.replacen("http", "ws", 1)
    );
    let ws = tokio::spawn(until_ws_closes(url));
    // Both are open (and stay so while the key works).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !sse.is_finished() && !ws.is_finished(),
        "the streams stay open while the key works"
    );
    [sse, ws]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_made_by_the_cli_works_and_once_revoked_stops_at_once_streams_included() {
    let scratch = Scratch::new();
    let db = scratch.db().to_str().expect("utf-8 path").to_owned();
    let server = ServeProcess::start(&scratch, &[]);
    let api = &server.api;
    let model = scratch.script("s.jsonl", &[r#"{"text": "Hi."}"#]);
    // No token, no key yet, on loopback: the operator, as always.
    assert_eq!(api.get("/v1/whoami").await.body["kind"], "operator");

    let made = create_key(&db, "acme", "ci", "read,submit", &[]);
    let key = made["key"].as_str().expect("the key").to_owned();
    let id = made["id"].as_str().expect("the id").to_owned();
    assert!(key.starts_with(&format!("keel_{id}_")), "{key}");
    assert!(made.get("hash").is_none(), "{made}");
    key_works(api, &key).await;
    assert_eq!(
        whoami(api, &key).await.body,
        json!({"tenant": "acme", "principal_id": id, "kind": "api_key", "name": "ci", "scopes": ["read", "submit"]})
    );
    // With keys handed out, no credential is no longer the operator.
    assert_unauthorized(&api.get("/v1/whoami").await, "no credential once keys exist");
    assert_unauthorized(&whoami(api, &format!("{key}x")).await, "a wrong secret");
    assert_unauthorized(
        &whoami(api, &key.replacen(&id, "0000000000000000", 1)).await,
        "an unknown id",
    );

    let acme = with(api, &key);
    let created = acme.post("/v1/sessions", &json!({"model": model})).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let session = created.body["id"].as_str().expect("the session's id");
    let streams = open_streams(api, &key, session).await;

    // The list shows the key without its secret or hash.
    let listed = keel_keys(&db, &["list", "--json"]);
    let text = String::from_utf8_lossy(&listed.stdout);
    let secret = key.rsplit_once('_').expect("secret").1;
    assert!(text.contains(&id) && !text.contains(secret), "{text}");
    assert!(!text.contains("hash"), "{text}");
    let table = String::from_utf8_lossy(&keel_keys(&db, &["list"]).stdout).to_string();
    assert!(table.contains(&id) && table.contains("active"), "{table}");

    revoke_key(&db, &id);
    let revoked_at = Instant::now();
    within(ENFORCED_WITHIN, "the revoked key refused", || async {
        whoami(api, &key).await.status == StatusCode::UNAUTHORIZED
    })
    .await;
    for (stream, what) in streams.into_iter().zip(["the event stream", "the WebSocket"]) {
        let ended = guard(what, stream).await.expect("the watcher");
        let after = ended.saturating_duration_since(revoked_at);
        assert!(after < ENFORCED_WITHIN, "{what} ended {after:?} after the revocation");
    }
    assert_unauthorized(&acme.get("/v1/sessions").await, "the revoked key");
    let table = String::from_utf8_lossy(&keel_keys(&db, &["list"]).stdout).to_string();
    assert!(table.contains("revoked"), "{table}");
    // An unknown id is an error.
    assert!(!keel_keys(&db, &["revoke", "0000000000000000"]).status.success());
    server.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_key_is_401_and_its_streams_end() {
    let scratch = Scratch::new();
    let db = scratch.db().to_str().expect("utf-8 path").to_owned();
    let server = ServeProcess::start(&scratch, &[]);
    let api = &server.api;
    let model = scratch.script("s.jsonl", &[r#"{"text": "Hi."}"#]);
    let made = create_key(&db, "acme", "short", "read,submit", &["--expires-in", "3s"]);
    let key = made["key"].as_str().expect("the key").to_owned();
    let expires_at = made["expires_at_ms"].as_u64().expect("an expiry");
    key_works(api, &key).await;
    let created = with(api, &key).post("/v1/sessions", &json!({"model": model})).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let session = created.body["id"].as_str().expect("the session's id");
    let streams = open_streams(api, &key, session).await;
    for stream in streams {
        guard("a stream of an expiring key", stream).await.expect("the watcher");
    }
    let now = keel::protocol::now_ms();
    assert!(now + 100 >= expires_at, "the streams ended at the expiry, not before");
    assert_unauthorized(&whoami(api, &key).await, "an expired key");
    server.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admins_manage_keys_over_the_api_within_their_tenant() {
    let scratch = Scratch::new();
    let token_file = scratch.dir.path().join("token");
    std::fs::write(&token_file, "operator-token\n").expect("write the token");
    let server = ServeProcess::start(&scratch, &["--token-file", token_file.to_str().expect("utf-8")]);
    let operator = with(&server.api, "operator-token");

    let made = operator
        .post(
            "/v1/keys",
            &json!({"tenant": "acme", "name": "acme admin", "scopes": ["admin", "read"]}),
        )
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    assert_eq!(made.body["tenant"], "acme");
    assert_eq!(made.body["scopes"], json!(["read", "admin"]));
    assert!(made.body.get("hash").is_none());
    let admin = with(&server.api, made.body["key"].as_str().expect("key"));
    // Works on this node at once.
    assert_eq!(admin.get("/v1/whoami").await.body["tenant"], "acme");

    let other = operator
        .post(
            "/v1/keys",
            &json!({"tenant": "globex", "name": "globex ci", "scopes": ["read"],
                    "expires_at_ms": keel::protocol::now_ms() + 3_600_000}),
        )
        .await;
    assert_eq!(other.status, StatusCode::CREATED, "{}", other.body);
    assert!(other.body["expires_at_ms"].as_u64().is_some());
    let globex_key = other.body["key"].as_str().expect("key").to_owned();
    let globex_id = other.body["id"].as_str().expect("id").to_owned();

    // The operator sees every key; acme's admin only acme's; no secrets.
    let all = operator.get("/v1/keys").await;
    assert_eq!(all.status, StatusCode::OK);
    assert_eq!(all.body["keys"].as_array().expect("keys").len(), 2);
    assert!(!all.body.to_string().contains(&globex_key[20..]));
    let own = admin.get("/v1/keys").await;
    let tenants: Vec<&str> = own.body["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .map(|key| key["tenant"].as_str().expect("tenant"))
        .collect();
    assert_eq!(tenants, ["acme"]);

    // acme's admin: its own tenant by default, never another's.
    let child = admin
        .post("/v1/keys", &json!({"name": "acme reader", "scopes": ["read"]}))
        .await;
    assert_eq!(child.status, StatusCode::CREATED, "{}", child.body);
    assert_eq!(child.body["tenant"], "acme");
    let across = admin
        .post(
            "/v1/keys",
            &json!({"tenant": "globex", "name": "x", "scopes": ["read"]}),
        )
        .await;
    assert_eq!(across.status, StatusCode::FORBIDDEN);
    assert_eq!(across.code(), "missing_scope_admin");
    let revoke_across = admin
        .send(admin.client.delete(admin.url(&format!("/v1/keys/{globex_id}"))))
        .await;
    assert_eq!(
        revoke_across.status,
        StatusCode::NOT_FOUND,
        "another tenant's key is unknown"
    );
    assert_eq!(whoami(&server.api, &globex_key).await.status, StatusCode::OK);

    // The metrics are the operator's only, even for an admin key: a
    // tenant's administrator is not the server's.
    let metrics = admin.get("/metrics").await;
    assert_eq!(
        (metrics.status, metrics.code()),
        (StatusCode::FORBIDDEN, "missing_scope_admin"),
        "a key on /metrics: {}",
        metrics.body
    );
    assert!(operator.metrics().await.contains("keel_http_requests_total"));
    // Without admin: 403 naming it.
    let reader = with(&server.api, child.body["key"].as_str().expect("key"));
    assert_eq!(reader.get("/v1/keys").await.code(), "missing_scope_admin");
    // Bad requests.
    for body in [
        json!({"tenant": "acme", "name": "x", "scopes": ["root"]}),
        json!({"tenant": "acme", "name": "x", "scopes": []}),
        json!({"tenant": "a%b", "name": "x", "scopes": ["read"]}),
        json!({"tenant": "t\u{e9}", "name": "x", "scopes": ["read"]}),
        json!({"tenant": "acme", "name": "x\u{7}", "scopes": ["read"]}),
        json!({"tenant": "acme", "name": "x", "scopes": ["read"], "expires_in_secs": 60}),
    ] {
        let refused = operator.post("/v1/keys", &body).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{body}: {}", refused.body);
    }
    // The operator's own tenant is no key's unless keel.toml says so
    // (named, or by the operator's default).
    for body in [
        json!({"tenant": "default", "name": "x", "scopes": ["read"]}),
        json!({"name": "x", "scopes": ["read"]}),
    ] {
        let refused = operator.post("/v1/keys", &body).await;
        assert_eq!(
            (refused.status, refused.code()),
            (StatusCode::FORBIDDEN, "tenant_forbidden"),
            "{body}: {}",
            refused.body
        );
        let message = refused.body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("allow_default_tenant"), "{message}");
    }
    let named = operator
        .post(
            "/v1/keys",
            &json!({"tenant": "org:42", "name": "x", "scopes": ["read"]}),
        )
        .await;
    assert_eq!(
        named.status,
        StatusCode::CREATED,
        "one grammar of tenants: {}",
        named.body
    );

    // The operator revokes globex's key: 204, then refused on this node at once.
    let revoked = operator
        .send(operator.client.delete(operator.url(&format!("/v1/keys/{globex_id}"))))
        .await;
    assert_eq!(revoked.status, StatusCode::NO_CONTENT);
    assert_unauthorized(&whoami(&server.api, &globex_key).await, "a key revoked over the API");
    let listed = operator.get("/v1/keys").await;
    let globex = listed.body["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .find(|key| key["id"] == globex_id.as_str())
        .cloned()
        .expect("still listed");
    assert!(globex["revoked_at_ms"].as_u64().is_some(), "{globex}");
    let unknown = operator
        .send(operator.client.delete(operator.url("/v1/keys/nope")))
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);

    // Uses are recorded in batches (every few seconds).
    within(Duration::from_secs(10), "last use recorded", || async {
        let listed = operator.get("/v1/keys").await;
        listed.body["keys"].as_array().is_some_and(|keys| {
            keys.iter()
                .any(|key| key["name"] == "acme admin" && key["last_used_at_ms"].is_u64())
        })
    })
    .await;
    server.terminate();
}
