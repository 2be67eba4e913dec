//! The sweep: every session route and method, listed from the OpenAPI
//! document the server serves (so a route added later is swept too), asked
//! by tenant B about tenant A's session, answers exactly as for a session
//! that does not exist, and nothing of A's reaches B. Then each scope,
//! missing, on every route that needs it.

use std::collections::BTreeSet;

use futures::{SinkExt, StreamExt};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use super::keys::serve_with_keys;
use crate::suite::support::api::Api;
use crate::suite::support::wait::guard;

/// A's session, its fork, and an id no session has: all of one length, so
/// that an answer echoing the id has the same length for each.
const A_SESSION: &str = "a-secret-session-0001";
const A_FORK: &str = "a-secret-forked-00002";
const UNKNOWN: &str = "zz-no-such-session-09";
const A_TITLE: &str = "Alpha's confidential title";
const A_TEXT: &str = "alpha-private-message-text";

/// One operation of the description.
#[derive(Debug, Clone)]
struct Operation {
    method: Method,
    path: String,
    id: String,
    scope: Option<String>,
}

/// Every operation of the document, with its scope (`x-keel-scope`).
fn operations(document: &Value) -> Vec<Operation> {
    let mut found = Vec::new();
    for (path, item) in document["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("path item") {
            let Ok(method) = method.to_uppercase().parse::<Method>() else {
                continue;
            };
            let Some(id) = operation["operationId"].as_str() else {
                continue;
            };
            found.push(Operation {
                method,
                path: path.clone(),
                id: id.to_owned(),
                scope: operation["x-keel-scope"].as_str().map(str::to_owned),
            });
        }
    }
    found
}

/// A body the operation accepts, so the request reaches the session check
/// (a body the route refuses would be refused before it, for any session).
fn body_of(operation: &str) -> Option<Value> {
    match operation {
        "submit" => Some(json!({"op": {"type": "user_input", "text": "from tenant B"}})),
        "fork_session" => Some(json!({"at_sequence": 1})),
        "update_session" => Some(json!({"title": "renamed by B"})),
        "create_session" => Some(json!({})),
        "create_key" => Some(json!({"name": "swept", "scopes": ["read"]})),
        "create_webhook" => Some(json!({"url": "https://hooks.example.com/swept", "event_types": ["turn_complete"]})),
        "rotate_webhook_secret" => Some(json!({})),
        _ => None,
    }
}

/// An answer as B sees it: status, headers (but the date) and body.
#[derive(Debug, PartialEq)]
struct Seen {
    status: StatusCode,
    headers: Vec<(String, String)>,
    body: String,
}

async fn ask(api: &Api, operation: &Operation, id: &str) -> Seen {
    let path = operation.path.replace("{id}", id);
    let mut request = api.client.request(operation.method.clone(), api.url(&path));
    if let Some(body) = body_of(&operation.id) {
        request = request.json(&body);
    }
    if operation.id == "connect_websocket" {
        // A real upgrade request: the answer comes before any upgrade.
        request = request
            .header("connection", "upgrade")
            .header("upgrade", "websocket")
            .header("sec-websocket-version", "13")
            .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==");
    }
    if let Some(token) = &api.token {
        request = request.bearer_auth(token);
    }
    let response = guard("a request of the sweep", request.send()).await.expect("send");
    let status = response.status();
    let headers = response
        .headers()
        .iter()
        .filter(|(name, _)| name.as_str() != "date")
        .map(|(name, value)| (name.as_str().to_owned(), value.to_str().unwrap_or("?").to_owned()))
        .collect();
    let body = guard("the body", response.text()).await.expect("body");
    Seen { status, headers, body }
}

/// What must never reach tenant B.
fn assert_nothing_of_a(seen: &Seen, what: &str) {
    let text = format!("{:?} {}", seen.headers, seen.body);
    for secret in [A_TITLE, A_TEXT, A_FORK] {
        assert!(!text.contains(secret), "{what}: `{secret}` leaked in {text}");
    }
}

/// Tenant A's session (titled, with a message and a fork), made with A's key.
/// A's session and its fork, under ids the operator chose for them (only
/// the operator may choose ids).
async fn a_session(operator: &Api, a: &Api) {
    operator.create(json!({"id": A_SESSION, "tenant": "alpha"})).await;
    a.say(A_SESSION, A_TEXT).await;
    a.wait_idle(A_SESSION).await;
    let renamed = a
        .patch(&format!("/v1/sessions/{A_SESSION}"), &json!({"title": A_TITLE}))
        .await;
    assert_eq!(renamed.status, StatusCode::OK, "{}", renamed.body);
    let fork = operator
        .post(
            &format!("/v1/sessions/{A_SESSION}/fork"),
            &json!({"id": A_FORK, "at_sequence": 1}),
        )
        .await;
    assert_eq!(fork.status, StatusCode::CREATED, "{}", fork.body);
    assert_eq!(fork.body["tenant"], "alpha");
}

#[tokio::test]
async fn tenant_b_finds_nothing_of_tenant_as_sessions_on_any_route() {
    let (server, keys) = serve_with_keys().await;
    let a = keys.key("alpha", &["read", "submit", "approve", "admin"]).await;
    let b = keys.key("beta", &["read", "submit", "approve", "admin"]).await;
    a_session(&server.operator, &a).await;
    let document = server.api.get("/v1/openapi.json").await.body;
    let session_routes: Vec<Operation> = operations(&document)
        .into_iter()
        .filter(|operation| operation.path.starts_with("/v1/sessions/{id}"))
        .collect();
    let swept: BTreeSet<&str> = session_routes.iter().map(|operation| operation.id.as_str()).collect();
    // The routes the issue names, at least; any other is swept as well.
    for expected in [
        "get_session",
        "update_session",
        "delete_session",
        "fork_session",
        "submit",
        "list_events",
        "stream_events",
        "connect_websocket",
    ] {
        assert!(
            swept.contains(expected),
            "{expected} is not in the description: {swept:?}"
        );
    }
    for target in [A_SESSION, A_FORK] {
        let unknown = &UNKNOWN[..target.len()];
        for operation in &session_routes {
            let theirs = ask(&b, operation, target).await;
            let none = ask(&b, operation, unknown).await;
            let what = format!("{} {} on {target}", operation.method, operation.path);
            assert_eq!(theirs.status, StatusCode::NOT_FOUND, "{what}: {}", theirs.body);
            assert!(theirs.body.contains("\"not_found\""), "{what}: {}", theirs.body);
            // Exactly the unknown id's answer, but for the id B sent.
            let echoed = Seen {
                status: theirs.status,
                headers: theirs.headers.clone(),
                body: theirs.body.replace(target, unknown),
            };
            assert_nothing_of_a(&echoed, &what);
            assert_eq!(echoed, none, "{what}");
        }
    }
    // A's sessions are untouched by all of it.
    let mine = a.session(A_SESSION).await;
    assert_eq!(mine["title"], A_TITLE);
    assert_eq!(a.session(A_FORK).await["tenant"], "alpha");

    // B's listings and usage show none of A's, and asking for A's tenant
    // finds nothing.
    let b_own = b.create(json!({})).await["id"].as_str().expect("an id").to_owned();
    // B may not choose an id: the answer for A's id is the answer for a
    // free one, so a taken id tells nothing.
    let taken = b.post("/v1/sessions", &json!({"id": A_SESSION})).await;
    let free = b.post("/v1/sessions", &json!({"id": UNKNOWN})).await;
    assert_eq!(
        (taken.status, taken.code()),
        (StatusCode::FORBIDDEN, "tenant_forbidden"),
        "{}",
        taken.body
    );
    assert_eq!(taken.body, free.body);
    let fork_taken = b
        .post(&format!("/v1/sessions/{b_own}/fork"), &json!({"id": A_FORK}))
        .await;
    let fork_free = b
        .post(&format!("/v1/sessions/{b_own}/fork"), &json!({"id": UNKNOWN}))
        .await;
    assert_eq!(fork_taken.code(), "tenant_forbidden", "{}", fork_taken.body);
    assert_eq!(fork_taken.body, fork_free.body);
    for path in [
        "/v1/sessions",
        "/v1/sessions?order=activity",
        "/v1/sessions?tenant=alpha",
        "/v1/usage",
        "/v1/usage?tenant=alpha",
    ] {
        let reply = b.get(path).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.body);
        // Only B's own `?tenant=alpha` may come back, as the report's `tenant`.
        let text = reply.body.to_string().replace("\"tenant\":\"alpha\"", "");
        for secret in [A_SESSION, A_FORK, A_TITLE, A_TEXT, "alpha"] {
            assert!(!text.contains(secret), "{path}: `{secret}` in {text}");
        }
    }
    let listed = b.get("/v1/sessions").await.body;
    assert_eq!(listed["sessions"].as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(listed["sessions"][0]["tenant"], "beta");
    // B cannot make a session in A's tenant either.
    let refused = b.post("/v1/sessions", &json!({"tenant": "alpha"})).await;
    assert_eq!(
        (refused.status, refused.code()),
        (StatusCode::FORBIDDEN, "tenant_forbidden")
    );
    // The operator sees both.
    let all = server.operator.get("/v1/sessions").await.body.to_string();
    assert!(all.contains(A_SESSION) && all.contains(&b_own), "{all}");
}

#[tokio::test]
async fn every_route_refuses_credentials_without_its_scope() {
    let (server, keys) = serve_with_keys().await;
    let all = ["read", "submit", "approve", "admin"];
    let owner = keys.key("beta", &all).await;
    server
        .operator
        .create(json!({"id": "b-scoped", "tenant": "beta"}))
        .await;
    owner.say("b-scoped", "hello").await;
    owner.wait_idle("b-scoped").await;
    let document = server.api.get("/v1/openapi.json").await.body;
    // Open to anyone, or to any principal whatever its scopes.
    let open = ["get_openapi", "healthz", "readyz", "whoami"];
    for operation in operations(&document) {
        if open.contains(&operation.id.as_str()) {
            assert!(operation.scope.is_none(), "{operation:?}");
            continue;
        }
        let scope = operation
            .scope
            .clone()
            .unwrap_or_else(|| panic!("{} {} states no scope", operation.method, operation.path));
        let without: Vec<&str> = all.iter().copied().filter(|other| *other != scope).collect();
        let lacking = keys.key("beta", &without).await;
        let seen = ask(&lacking, &operation, "b-scoped").await;
        let expected = format!("\"missing_scope_{scope}\"");
        assert_eq!(seen.status, StatusCode::FORBIDDEN, "{operation:?}: {}", seen.body);
        assert!(seen.body.contains(&expected), "{operation:?}: {}", seen.body);
        // The same on a session that does not exist: the scope comes first.
        if operation.path.contains("{id}") {
            let none = ask(&lacking, &operation, "b-no-such").await;
            assert_eq!(none.status, StatusCode::FORBIDDEN, "{operation:?}: {}", none.body);
            assert!(none.body.contains(&expected), "{operation:?}: {}", none.body);
        }
    }

    // An approval needs `approve`, over HTTP and in a WebSocket frame, and
    // `submit` does not give it.
    let approval = json!({"op": {"type": "approval", "call_id": "c-1", "decision": "approve"}});
    let submitter = keys.key("beta", &["read", "submit"]).await;
    let refused = submitter.submit("b-scoped", approval.clone()).await;
    assert_eq!(
        (refused.status, refused.code()),
        (StatusCode::FORBIDDEN, "missing_scope_approve"),
        "{}",
        refused.body
    );
    let approver = keys.key("beta", &["read", "approve"]).await;
    let allowed = approver.submit("b-scoped", approval.clone()).await;
    assert!(
        !allowed.code().starts_with("missing_scope"),
        "{}: {}",
        allowed.status,
        allowed.body
    );
    let said = approver
        .submit("b-scoped", json!({"op": {"type": "user_input", "text": "hi"}}))
        .await;
    assert_eq!(said.code(), "missing_scope_submit", "{}", said.body);

    let token = submitter.token.clone().expect("a key");
    let url = format!(
        "{}/v1/sessions/b-scoped/ws?access_token={token}",
        server.api.base.replacen("http", "ws", 1)
    );
    let (mut socket, _) = guard("WebSocket connect", tokio_tungstenite::connect_async(url))
        .await
        .expect("connect");
    let mut frame = approval.clone();
    frame["request_id"] = json!("r-1");
    guard("send", socket.send(Message::text(frame.to_string())))
        .await
        .expect("send");
    let reply = loop {
        let message = guard("a frame", socket.next()).await.expect("open").expect("a frame");
        let Message::Text(text) = message else { continue };
        let value: Value = serde_json::from_str(text.as_str()).expect("JSON");
        if value["type"] == "submission_error" || value["type"] == "submission_accepted" {
            break value;
        }
    };
    assert_eq!(reply["type"], "submission_error", "{reply}");
    assert_eq!(reply["request_id"], "r-1");
    assert_eq!(reply["error"]["code"], "missing_scope_approve", "{reply}");

    // The operator's token has every scope on every tenant.
    assert_eq!(server.operator.get("/v1/usage").await.status, StatusCode::OK);
    // A tenant's admin is not the server's: every tenant's metrics are not its.
    let tenant_admin = keys.key("beta", &all).await;
    let metrics = tenant_admin.get("/metrics").await;
    assert_eq!(metrics.code(), "missing_scope_admin", "{}", metrics.body);
    assert_eq!(metrics.status, StatusCode::FORBIDDEN);
    let message = metrics.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("`admin` over every tenant"), "{message}");
}
