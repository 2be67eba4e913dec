//! API keys across three `keel serve` nodes on one PostgreSQL database: a
//! key made on one node works on the others, and a revocation on one is
//! enforced on all within a second.

use std::process::Command;
use std::time::{Duration, Instant};

use keel::store::postgres::local::LocalPostgres;
use reqwest::StatusCode;
use serde_json::json;

use super::keys::{create_key, revoke_key};
use super::{whoami, with, within};
use crate::suite::support::server::{Scratch, ServeProcess};

/// How soon every node must enforce a change of keys.
const EVERY_NODE_WITHIN: Duration = Duration::from_secs(1);

/// Node `index` on `url`, with the operator's token in `token_file`.
fn node(scratch: &Scratch, url: &str, index: usize, token_file: &str) -> ServeProcess {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(["serve", "--db", url, "--listen", "127.0.0.1:0"])
        .args(["--node-id", &format!("node-{index}"), "--token-file", token_file])
        .arg("--workspace-root")
        .arg(scratch.workspaces())
        .env_remove("KEEL_MODEL")
        .env_remove("KEEL_CONFIG")
        .env_remove("KEEL_DB")
        .env("KEEL_LOG", "warn")
        .current_dir(scratch.dir.path());
    ServeProcess::spawn(command)
}

/// Waits until `key`'s `/v1/whoami` answers `status` on every node, and
/// returns how long the slowest took.
async fn on_every_node(nodes: &[ServeProcess], key: &str, status: StatusCode, what: &str) -> Duration {
    let mut slowest = Duration::ZERO;
    let start = Instant::now();
    for node in nodes {
        within(EVERY_NODE_WITHIN * 3, what, || async {
            whoami(&node.api, key).await.status == status
        })
        .await;
        slowest = slowest.max(start.elapsed());
    }
    slowest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_made_or_revoked_on_one_node_is_enforced_on_all_within_a_second() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    let url = postgres.fresh_database();
    let scratch = Scratch::new();
    let token_file = scratch.dir.path().join("token");
    std::fs::write(&token_file, "operator-token\n").expect("write the token");
    let token_file = token_file.to_str().expect("utf-8").to_owned();
    let nodes: Vec<ServeProcess> = (0..3).map(|index| node(&scratch, &url, index, &token_file)).collect();

    // Made over the API of node 0.
    let made = with(&nodes[0].api, "operator-token")
        .post("/v1/keys", &json!({"tenant": "acme", "name": "ci", "scopes": ["read"]}))
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let made_at = Instant::now();
    let key = made.body["key"].as_str().expect("key").to_owned();
    let id = made.body["id"].as_str().expect("id").to_owned();
    on_every_node(&nodes, &key, StatusCode::OK, "the new key working everywhere").await;
    let took = made_at.elapsed();
    assert!(took < EVERY_NODE_WITHIN, "the key worked on every node after {took:?}");

    // Revoked over the API of node 1.
    let revoked = with(&nodes[1].api, "operator-token")
        .send(nodes[1].api.client.delete(nodes[1].api.url(&format!("/v1/keys/{id}"))))
        .await;
    assert_eq!(revoked.status, StatusCode::NO_CONTENT);
    let revoked_at = Instant::now();
    on_every_node(
        &nodes,
        &key,
        StatusCode::UNAUTHORIZED,
        "the revoked key refused everywhere",
    )
    .await;
    let took = revoked_at.elapsed();
    assert!(
        took < EVERY_NODE_WITHIN,
        "the revocation reached every node after {took:?}"
    );

    // Made and revoked by `keel keys` on the database itself.
    let made = create_key(&url, "globex", "cli", "read,submit", &[]);
    let key = made["key"].as_str().expect("key").to_owned();
    let made_at = Instant::now();
    on_every_node(&nodes, &key, StatusCode::OK, "the CLI's key working everywhere").await;
    assert!(made_at.elapsed() < EVERY_NODE_WITHIN, "after {:?}", made_at.elapsed());
    assert_eq!(whoami(&nodes[2].api, &key).await.body["tenant"], "globex");
    revoke_key(&url, made["id"].as_str().expect("id"));
    let revoked_at = Instant::now();
    on_every_node(
        &nodes,
        &key,
        StatusCode::UNAUTHORIZED,
        "the CLI's revocation everywhere",
    )
    .await;
    assert!(
        revoked_at.elapsed() < EVERY_NODE_WITHIN,
        "after {:?}",
        revoked_at.elapsed()
    );
    for node in nodes {
        node.terminate();
    }
}
