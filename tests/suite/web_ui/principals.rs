//! Signing in to the web UI with the server's token, an API key or a JWT:
//! the header shows the tenant, the page hides what the principal's scopes
//! forbid, names who sent a message when it was someone else, and goes back
//! to the sign-in box when the key is revoked mid-session.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{browser_test, scenario, serve};
use crate::suite::support::api::Api;
use crate::suite::support::server::{Scratch, ServeProcess};
use crate::suite::support::wait::wait_until_async;

/// A script: an answer, then a `write_file` call that waits for approval.
fn answer_then_approval(scratch: &Scratch) -> String {
    let call = json!({"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "a"}}]});
    scratch.script(
        "principals.jsonl",
        &[r#"{"text": "Hello from the model."}"#, &call.to_string()],
    )
}

/// A session, made through `api`, with one answered message and a tool call
/// waiting for approval; its id.
async fn session_waiting_for_approval(api: &Api) -> String {
    let id = api.create(json!({})).await["id"].as_str().expect("id").to_owned();
    api.say(&id, "Say hello").await;
    api.wait_idle(&id).await;
    api.say(&id, "Write a.txt").await;
    wait_until_async("the approval to be asked", Duration::from_secs(20), async || {
        api.session(&id).await["state"] == "awaiting_approval"
    })
    .await;
    id
}

/// The operator's token of these tests.
const OPERATOR_TOKEN: &str = "web-ui-operator";

/// A server whose model answers and then asks for an approval, behind
/// [`OPERATOR_TOKEN`]; its `api` carries that token.
fn operator_server(scratch: &Scratch) -> ServeProcess {
    let model = answer_then_approval(scratch);
    let path = scratch.dir.path().join("token");
    std::fs::write(&path, format!("{OPERATOR_TOKEN}\n")).expect("write the token file");
    let mut server = serve(scratch, &model, &["--token-file", &path.display().to_string()]);
    server.api.token = Some(OPERATOR_TOKEN.to_owned());
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_signed_in_with_the_token_is_the_operator_with_every_action() {
    let Some((tools, _browser, scratch)) =
        browser_test("web_ui_signed_in_with_the_token_is_the_operator_with_every_action").await
    else {
        return;
    };
    let server = operator_server(&scratch);
    let id = session_waiting_for_approval(&server.api).await;

    let outcome = scenario(
        &tools,
        "principals",
        &server.api.base,
        json!({
            "credential": OPERATOR_TOKEN,
            "session_id": id,
            "badge": "^Operator$",
            "tenant": "",
            "scopes": ["read", "submit", "approve", "admin"],
            "sender": "You",
        }),
    )
    .await;

    assert_eq!(outcome.result["shown"]["approve"], Value::Bool(true));
    let reply = server.api.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body["state"], "awaiting_approval", "the page only looked");
}

/// An API key made by the operator through `POST /v1/keys`: its id and
/// the key itself.
pub(super) async fn make_key(operator: &Api, tenant: &str, name: &str, scopes: &[&str]) -> (String, String) {
    let reply = operator
        .post("/v1/keys", &json!({"tenant": tenant, "name": name, "scopes": scopes}))
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
    let field = |name: &str| reply.body[name].as_str().expect(name).to_owned();
    (field("id"), field("key"))
}

/// `api`'s server, with `key` as the bearer.
pub(super) fn as_key(api: &Api, key: &str) -> Api {
    let mut keyed = Api::new(api.base.clone());
    keyed.token = Some(key.to_owned());
    keyed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_with_keys_shows_the_tenant_hides_what_the_scopes_forbid_and_signs_in_again_after_a_revocation() {
    let Some((tools, _browser, scratch)) = browser_test(
        "web_ui_with_keys_shows_the_tenant_hides_what_the_scopes_forbid_and_signs_in_again_after_a_revocation",
    )
    .await
    else {
        return;
    };
    let server = operator_server(&scratch);
    let (_, writer) = make_key(&server.api, "acme", "writer", &["read", "submit"]).await;
    let (_, reader) = make_key(&server.api, "acme", "reader", &["read"]).await;
    let (helper_id, helper) = make_key(&server.api, "acme", "helper", &["read", "submit"]).await;
    let id = session_waiting_for_approval(&as_key(&server.api, &writer)).await;
    let params = |credential: &str, name: &str, scopes: &[&str]| {
        json!({
            "credential": credential,
            "session_id": id,
            "badge": format!("^Tenant acme · {name}$"),
            "tenant": "acme",
            "scopes": scopes,
        })
    };

    // Read only: no Approve, no message box, no New chat, no Delete; the
    // message the writer key sent names it.
    let mut reading = params(&reader, "reader", &["read"]);
    reading["sender"] = json!("writer");
    let read_only = scenario(&tools, "principals", &server.api.base, reading).await;
    assert_eq!(read_only.result["shown"]["approve"], false);
    assert_eq!(read_only.result["shown"]["composer"], false);

    // Read and submit, not approve: the message box, but no Approve; then
    // the key is revoked while the page follows the session.
    let mut submitter = params(&helper, "helper", &["read", "submit"]);
    submitter["sender"] = json!("writer");
    submitter["revoke"] = json!({"method": "DELETE", "path": format!("/v1/keys/{helper_id}"), "token": OPERATOR_TOKEN});
    let outcome = scenario(&tools, "principals", &server.api.base, submitter).await;
    assert_eq!(outcome.result["shown"]["approve"], false);
    assert_eq!(outcome.result["shown"]["composer"], true);

    let helper_api = as_key(&server.api, &helper);
    assert_eq!(
        helper_api.get(&format!("/v1/sessions/{id}")).await.status,
        StatusCode::UNAUTHORIZED,
        "the revoked key is refused"
    );
    let session = server.api.session(&id).await;
    assert_eq!(session["state"], "awaiting_approval", "nobody decided the approval");
}
