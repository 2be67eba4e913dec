//! `[tenants.<id>]`: a tenant's ceiling narrows the server's for its
//! sessions, and never widens it.

use keel::config::{TenantConfig, TenantTools};
use keel::tools::workspace::SandboxPolicy;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::suite::support::api::Api;
use crate::suite::support::server::TestServer;

const ANSWER: &str = r#"{"text": "hi"}"#;

async fn status(api: &Api, body: Value) -> (StatusCode, String) {
    let reply = api.post("/v1/sessions", &body).await;
    (reply.status, reply.code().to_owned())
}

fn forbidden(code: &str) -> (StatusCode, String) {
    (StatusCode::FORBIDDEN, code.to_owned())
}

fn created() -> (StatusCode, String) {
    (StatusCode::CREATED, String::new())
}

#[tokio::test]
async fn a_tenants_table_narrows_the_servers_ceiling_for_its_sessions_only() {
    let server = TestServer::start(|config, scratch| {
        config.default_model = Some(scratch.script("answer.jsonl", &[ANSWER]));
        // A generous server ...
        config.keel.server.max_sandbox = SandboxPolicy::FullAccess;
        config.keel.server.allow_network = true;
        config.keel.server.auto_approve = vec!["*".to_owned()];
        // ... and a tenant held to much less.
        config.keel.tenants.insert(
            "narrow".to_owned(),
            TenantConfig {
                max_sandbox: Some(SandboxPolicy::ReadOnly),
                auto_approve: Some(vec!["read_file".to_owned()]),
                allow_network: Some(false),
                tools: TenantTools {
                    shell: false,
                    ..TenantTools::default()
                },
                ..TenantConfig::default()
            },
        );
    })
    .await;
    let api = &server.api;
    let cases = [
        (json!({"tools": {"sandbox": "full-access"}}), "sandbox_over_ceiling"),
        (json!({"tools": {"sandbox": "workspace-write"}}), "sandbox_over_ceiling"),
        (json!({"tools": {"network": true}}), "network_over_ceiling"),
        (json!({"tools": {"shell": true}}), "tool_over_ceiling"),
        (
            json!({"approvals": {"tools": {"write_file": "auto"}}}),
            "auto_approval_over_ceiling",
        ),
    ];
    for (asked, code) in &cases {
        let mut body = asked.clone();
        body["tenant"] = json!("narrow");
        assert_eq!(status(api, body).await, forbidden(code), "{asked}");
        // The same request for another tenant is within the server's ceiling.
        let mut body = asked.clone();
        body["tenant"] = json!("other");
        assert_eq!(status(api, body).await, created(), "{asked}");
    }
    let allowed = json!({"tenant": "narrow", "tools": {"sandbox": "read-only"},
        "approvals": {"tools": {"read_file": "auto"}}});
    assert_eq!(status(api, allowed).await, created());
    server.stop().await;
}

#[tokio::test]
async fn a_tenant_table_asking_for_more_than_the_server_gets_the_servers_ceiling() {
    let server = TestServer::start(|config, scratch| {
        config.default_model = Some(scratch.script("answer.jsonl", &[ANSWER]));
        // The server's defaults: workspace-write at most, no network, the
        // reading tools auto-approved only.
        config.keel.tenants.insert(
            "greedy".to_owned(),
            TenantConfig {
                max_sandbox: Some(SandboxPolicy::FullAccess),
                auto_approve: Some(vec!["*".to_owned()]),
                allow_network: Some(true),
                ..TenantConfig::default()
            },
        );
    })
    .await;
    let api = &server.api;
    for (asked, code) in [
        (json!({"tools": {"sandbox": "full-access"}}), "sandbox_over_ceiling"),
        (json!({"tools": {"network": true}}), "network_over_ceiling"),
        (
            json!({"approvals": {"tools": {"shell": "auto"}}}),
            "auto_approval_over_ceiling",
        ),
    ] {
        let mut body = asked.clone();
        body["tenant"] = json!("greedy");
        assert_eq!(status(api, body).await, forbidden(code), "{asked}");
    }
    server.stop().await;
}

#[tokio::test]
async fn a_tenants_sessions_start_from_its_narrowed_tools() {
    let server = TestServer::start(|config, scratch| {
        config.default_model = Some(scratch.script("answer.jsonl", &[ANSWER, ANSWER]));
        config.keel.tenants.insert(
            "readers".to_owned(),
            TenantConfig {
                tools: TenantTools {
                    write: false,
                    shell: false,
                    ..TenantTools::default()
                },
                ..TenantConfig::default()
            },
        );
    })
    .await;
    let api = &server.api;
    // A session that asks for nothing gets no tool its tenant turns off.
    api.create(json!({"id": "r1", "tenant": "readers"})).await;
    api.create(json!({"id": "d1"})).await;
    let tools = |events: &[keel::protocol::RecordedEvent]| -> Vec<String> {
        events
            .iter()
            .find_map(|event| match &event.msg {
                keel::protocol::EventMsg::SessionStarted(started) => Some(started.tools.clone()),
                _ => None,
            })
            .unwrap_or_default()
    };
    let scratch = server.stop().await;
    let readers = tools(&scratch.stored("r1").await);
    let default = tools(&scratch.stored("d1").await);
    assert!(default.iter().any(|tool| tool == "shell"), "{default:?}");
    assert!(readers.iter().any(|tool| tool == "read_file"), "{readers:?}");
    assert!(
        !readers.iter().any(|tool| tool == "shell" || tool == "write_file"),
        "{readers:?}"
    );
}

#[tokio::test]
async fn a_tenants_script_directory_outside_the_servers_stops_the_server_from_starting() {
    let scratch = crate::suite::support::server::Scratch::new();
    let outside = scratch.dir.path().join("elsewhere");
    std::fs::create_dir(&outside).expect("mkdir");
    let store = std::sync::Arc::new(keel::store::SqliteCheckpoint::new(scratch.db()).expect("store"));
    let mut config = keel::server::ServerConfig::new(store);
    config.workspace_root = scratch.workspaces();
    let scripts = scratch.dir.path().join("scripts");
    std::fs::create_dir(&scripts).expect("mkdir");
    config.keel.server.script_dir = Some(scripts);
    config.keel.tenants.insert(
        "acme".to_owned(),
        TenantConfig {
            script_dir: Some(outside),
            ..TenantConfig::default()
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let error = keel::server::serve(listener, config, std::future::pending())
        .await
        .expect_err("refused");
    assert!(error.to_string().contains("not inside"), "{error}");
}
