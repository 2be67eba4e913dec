//! A session belongs to a tenant: named by the operator at creation (its
//! own, `default`, otherwise), shown in the view, inherited by a fork,
//! filtering listings and usage, and choosing the workspace's directory.

use reqwest::StatusCode;
use serde_json::json;

use crate::suite::support::server::TestServer;

const ANSWER: &str = r#"{"text": "hi", "usage": {"input_tokens": 7, "output_tokens": 3}}"#;

async fn server() -> TestServer {
    TestServer::start(|config, scratch| {
        config.default_model = Some(scratch.script("answer.jsonl", &[ANSWER, ANSWER, ANSWER]));
    })
    .await
}

#[tokio::test]
async fn the_operator_names_a_sessions_tenant_and_the_view_shows_it() {
    let server = server().await;
    let api = &server.api;
    let plain = api.create(json!({"id": "plain"})).await;
    assert_eq!(plain["tenant"], "default");
    let acme = api.create(json!({"id": "a1", "tenant": "acme"})).await;
    assert_eq!(acme["tenant"], "acme");
    assert_eq!(api.session("a1").await["tenant"], "acme");
    for bad in [json!(""), json!("t\u{e9}"), json!("x".repeat(129)), json!(7)] {
        let reply = api.post("/v1/sessions", &json!({"tenant": bad})).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{bad}: {}", reply.body);
        assert_eq!(reply.code(), "invalid_request");
    }

    // The listing and the usage, per tenant or all of them.
    api.say("a1", "hello").await;
    api.wait_idle("a1").await;
    api.say("plain", "hello").await;
    api.wait_idle("plain").await;
    let ids = |body: &serde_json::Value| -> Vec<String> {
        body["sessions"]
            .as_array()
            .expect("sessions")
            .iter()
            .map(|session| session["id"].as_str().expect("id").to_owned())
            .collect()
    };
    let all = api.get("/v1/sessions").await;
    assert_eq!(ids(&all.body), ["a1", "plain"]);
    let only = api.get("/v1/sessions?tenant=acme").await;
    assert_eq!(ids(&only.body), ["a1"]);
    let none = api.get("/v1/sessions?tenant=nobody").await;
    assert_eq!(ids(&none.body), Vec::<String>::new());
    let usage = api.get("/v1/usage?tenant=acme").await;
    assert_eq!(usage.status, StatusCode::OK, "{}", usage.body);
    assert_eq!(usage.body["tenant"], "acme");
    assert_eq!(ids(&usage.body), ["a1"]);
    assert_eq!(usage.body["total"]["input_tokens"], 7);
    let everything = api.get("/v1/usage").await;
    assert_eq!(everything.body["tenant"], serde_json::Value::Null);
    assert_eq!(ids(&everything.body), ["a1", "plain"]);
    assert_eq!(everything.body["total"]["input_tokens"], 14);
    server.stop().await;
}

#[tokio::test]
async fn a_fork_keeps_its_parents_tenant_and_each_tenant_has_its_own_workspace_root() {
    let server = server().await;
    let api = &server.api;
    api.create(json!({"id": "s1", "tenant": "acme"})).await;
    api.create(json!({"id": "s2"})).await;
    api.create(json!({"id": "s3", "tenant": "Beta Corp"})).await;
    api.say("s1", "hello").await;
    api.wait_idle("s1").await;
    let root = server.scratch.workspaces();
    let acme = root.join("~tenants").join("acme");
    assert!(acme.join("s1").is_dir(), "a tenant's workspace is in its root");
    assert!(root.join("s2").is_dir(), "the default tenant keeps the old layout");
    assert!(!root.join("s1").exists() && !acme.join("s2").exists());
    // A name that is no plain path component is hashed, inside the tenants' directory.
    let beta: Vec<_> = std::fs::read_dir(root.join("~tenants"))
        .expect("the tenants' directory")
        .map(|entry| entry.expect("entry").file_name().into_string().expect("utf-8"))
        .collect();
    assert!(beta.iter().any(|name| name.starts_with('~')), "{beta:?}");
    assert!(!beta.iter().any(|name| name.contains(' ')), "{beta:?}");

    let fork = api
        .post(
            "/v1/sessions/s1/fork",
            &json!({"id": "f1", "at_sequence": api.session("s1").await["last_sequence"]}),
        )
        .await;
    assert_eq!(fork.status, StatusCode::CREATED, "{}", fork.body);
    assert_eq!(fork.body["tenant"], "acme");
    assert!(acme.join("f1").is_dir());

    // A stored session finds its workspace again, and `workspace=true` removes it.
    std::fs::write(acme.join("s1").join("note.txt"), "kept").expect("write");
    let scratch = server.stop().await;
    let server = TestServer::start_in(scratch, |config, scratch| {
        config.default_model = Some(scratch.script("answer2.jsonl", &[ANSWER]));
    })
    .await;
    let api = &server.api;
    api.say("s1", "again").await;
    api.wait_idle("s1").await;
    assert!(acme.join("s1").join("note.txt").is_file());
    let deleted = api
        .send(api.client.delete(api.url("/v1/sessions/s1?workspace=true")))
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.body);
    assert!(!acme.join("s1").exists() && acme.join("f1").is_dir());
    server.stop().await;
}

#[tokio::test]
async fn keel_sessions_rm_finds_a_tenants_workspace() {
    let server = server().await;
    server.api.create(json!({"id": "s1", "tenant": "acme"})).await;
    let scratch = server.stop().await;
    let workspace = scratch.workspaces().join("~tenants").join("acme").join("s1");
    std::fs::write(workspace.join("work.txt"), "work").expect("write");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["sessions", "rm", "s1", "--workspace", "--workspace-root"])
        .arg(scratch.workspaces())
        .arg("--db")
        .arg(scratch.db())
        .output()
        .expect("run keel");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(!workspace.exists(), "the tenant's workspace was removed");
    assert!(scratch.workspaces().join("~tenants").join("acme").is_dir());
}
