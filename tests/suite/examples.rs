//! The runtime as a library: `examples/embed.rs` runs and does what it says,
//! and a program that embeds Keel gets no HTTP server, terminal or
//! PostgreSQL crate.

use std::collections::BTreeSet;
use std::sync::Arc;

use keel::model::ScriptedModel;

// The example's own source, compiled into this binary: it is always built
// from the current code by `cargo test --test all`, runs without spawning a
// process or finding `target/<profile>/examples/`, and its `run` is called
// with a scripted model whatever the environment says. Its `main` and
// `model` are what `cargo run --example embed` uses.
#[path = "../../examples/embed.rs"]
#[allow(dead_code)]
mod embed;

#[tokio::test]
async fn the_embed_example_approves_a_write_and_resumes_after_a_restart() {
    let dir = tempfile::tempdir().expect("data directory");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/embed.jsonl");
    let model = Arc::new(ScriptedModel::load(script).expect("script"));
    let mut out = Vec::new();
    embed::run(dir.path(), model, &mut out).await.expect("the example runs");
    let out = String::from_utf8(out).expect("utf-8");

    // Lines are `SEQUENCE KIND`, or a message's text indented under it.
    let kinds: Vec<&str> = out
        .lines()
        .map(|line| line.split_once(' ').map_or(line, |(_, rest)| rest).trim())
        .collect();
    let expected_order = [
        "session_started",
        "approval_requested",
        "approval_decided",
        "tool_call_completed",
        "I wrote hello.txt.",
        "turn_complete",
        "session_started",
        "Still here: the session survived the restart.",
        "turn_complete",
    ];
    let mut rest = kinds.into_iter();
    for expected in expected_order {
        assert!(
            rest.any(|kind| kind == expected),
            "{expected} missing or out of order in:\n{out}"
        );
    }
    assert!(rest.next().is_none(), "events after the last turn ended:\n{out}");
    // One log across the restart: the sequence goes on where it stopped.
    let sequences: Vec<u64> = out
        .lines()
        .filter_map(|line| line.split_once(' ')?.0.parse().ok())
        .collect();
    assert_eq!(sequences.first(), Some(&1), "{out}");
    assert!(sequences.windows(2).all(|pair| pair[0] < pair[1]), "{out}");
    let written = std::fs::read_to_string(dir.path().join("work/hello.txt")).expect("the approved write ran");
    assert_eq!(written, "Hello from an embedded Keel.\n");
}

/// The packages and enabled features of `keel`'s normal dependency tree.
fn dependency_tree(features: &[&str]) -> BTreeSet<String> {
    let output = std::process::Command::new(env!("CARGO"))
        .args([
            "tree",
            "-p",
            "keel",
            "-e",
            "normal,features",
            "--prefix",
            "none",
            "--offline",
        ])
        .args(features)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| {
            // `axum v0.8.9 (*)` → `axum`; `hyper feature "server"` → `hyper/server`.
            match line.split_once(" feature ") {
                Some((package, feature)) => format!("{package}/{}", feature.split('"').nth(1).unwrap_or_default()),
                None => line.split(' ').next().unwrap_or_default().to_owned(),
            }
        })
        .collect()
}

#[test]
fn an_embedder_gets_no_http_server_terminal_or_postgres_crate() {
    // `hyper`, `hyper-util` and `tower-http` do come with reqwest, the
    // providers' HTTP client, but only their client halves: what must be
    // absent is their server features, next to the server crates themselves.
    let server_side = [
        "axum",
        "hyper/server",
        "hyper-util/server",
        "tower-http/cors",
        "tower-http/limit",
        "tokio-tungstenite",
        "rustyline",
        "clap",
        "tokio-postgres",
        "deadpool-postgres",
        "keel-server",
        "keel-bench",
        "keel-chaos",
    ];
    let embedded = dependency_tree(&["--no-default-features"]);
    assert!(
        embedded.contains("keel-agent") && embedded.contains("rusqlite"),
        "{embedded:?}"
    );
    let leaked: Vec<&str> = server_side
        .into_iter()
        .filter(|name| embedded.contains(*name))
        .collect();
    assert!(leaked.is_empty(), "an embedder of keel gets {leaked:?}");
    // The same names are found in the full build: the check can fail.
    let full = dependency_tree(&[]);
    let missing: Vec<&str> = server_side.into_iter().filter(|name| !full.contains(*name)).collect();
    assert!(
        missing.is_empty(),
        "the `cli` build lacks {missing:?}: the names are stale"
    );
}
