//! The commands on a PostgreSQL database (`--db postgres://…`), against a
//! real server the test harness starts: the same work as on a SQLite file,
//! and the same rule that a served database's sessions belong to its server.

use std::process::Command;

use keel::store::postgres::local::LocalPostgres;
use serde_json::json;

use crate::suite::support::events::{assert_gapless, ends_turn};
use crate::suite::support::process::{Cli, assert_one_line_error, parse_events, session_of, stderr, stdout};
use crate::suite::support::server::ServeProcess;
use crate::suite::support::wait::{HANG_GUARD, wait_until_async};

/// `keel serve` on the database at `url`, on a free loopback port, with
/// the scripts and workspaces in `cli`'s directory.
fn serve(cli: &Cli, url: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(["serve", "--db", url, "--listen", "127.0.0.1:0"])
        .arg("--workspace-root")
        .arg(cli.dir.path().join("workspaces"))
        .arg("--script-dir")
        .arg(cli.dir.path())
        .env_remove("KEEL_MODEL")
        .env_remove("KEEL_CONFIG")
        .env("KEEL_LOG", "warn")
        .current_dir(cli.dir.path());
    command
}

/// A fresh database's URL; `None` (the harness said why) without PostgreSQL.
fn database() -> Option<String> {
    LocalPostgres::shared().map(LocalPostgres::fresh_database)
}

#[test]
fn run_events_sessions_fork_and_rm_work_on_postgresql() {
    let Some(url) = database() else { return };
    let cli = Cli::new();
    let script = cli.script("s.jsonl", &[r#"{"text": "One."}"#, r#"{"text": "Two."}"#]);
    let model = format!("script:{}", script.display());
    let first = cli.run(&["run", "--db", &url, "--json", "--model", &model, "hello"]);
    assert!(first.status.success(), "{}", stderr(&first));
    let events = parse_events(&first.stdout);
    let session = session_of(&events);
    let again = cli.run(&["run", "--db", &url, "--session", &session, "again"]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(
        stdout(&again),
        "Two.\n",
        "the session kept its model and script position"
    );

    let logged = cli.run(&[
        "events",
        "--db",
        &url,
        "--session",
        &session,
        "--json",
        "--limit",
        "1000",
    ]);
    assert!(logged.status.success(), "{}", stderr(&logged));
    let log = parse_events(&logged.stdout);
    assert_gapless(&log, 1);
    assert_eq!(log.iter().filter(|event| event.msg.ends_turn()).count(), 2);

    let listed = cli.run(&["sessions", "--db", &url, "--json"]);
    assert!(stdout(&listed).contains(&session), "{}", stdout(&listed));
    let end_of_first = log.iter().find(|event| event.msg.ends_turn()).expect("a turn").sequence;
    let forked = cli.run(&[
        "fork",
        "--db",
        &url,
        &session,
        "--at",
        &end_of_first.to_string(),
        "--id",
        "child",
    ]);
    assert!(forked.status.success(), "{}", stderr(&forked));
    let removed = cli.run(&["sessions", "rm", "--db", &url, "child"]);
    assert!(removed.status.success(), "{}", stderr(&removed));
    let gone = cli.run(&["events", "--db", &url, "--session", "child", "--json"]);
    assert!(stdout(&gone).trim().is_empty(), "{}", stdout(&gone));

    let backup = cli.run(&["backup", "--db", &url, "copy.sqlite3"]);
    assert_one_line_error(&backup, "pg_dump");
    let malformed = cli.run(&["sessions", "--db", "postgres://keel@127.0.0.1:1/none?connect_timeout=1"]);
    assert_one_line_error(&malformed, "cannot reach the database");
}

/// `keel serve` on PostgreSQL: turns over HTTP; a second server joins as
/// another node; a local command on a served database is refused and told
/// who serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_on_postgresql_and_holds_the_database_like_a_sqlite_file() {
    let Some(url) = database() else { return };
    let cli = Cli::new();
    cli.script("s.jsonl", &[r#"{"text": "Served."}"#]);
    let server = ServeProcess::spawn(serve(&cli, &url));
    let model = format!("script:{}", cli.dir.path().join("s.jsonl").display());
    server.api.create(json!({"id": "served", "model": model})).await;
    let mut stream = server
        .api
        .stream("served", crate::suite::support::api::Resume::Start)
        .await;
    server.api.say("served", "hi").await;
    let turn = stream.until(ends_turn).await;
    assert_eq!(turn.last().map(|event| event.msg.kind()), Some("turn_complete"));
    server.api.wait_idle("served").await;

    let second = ServeProcess::spawn(serve(&cli, &url));
    let shown = second.api.session("served").await;
    assert_eq!(shown["id"], "served", "{shown}");
    let (status, _) = second.terminate();
    assert!(status.success(), "{status:?}");
    let local = cli.run(&["run", "--db", &url, "--session", "served", "again"]);
    assert!(!local.status.success());
    assert!(stderr(&local).contains("is served by keel serve"), "{}", stderr(&local));

    let (status, _) = server.terminate();
    assert!(status.success(), "{status:?}");
    // Once the server is gone, the database is the local commands' again.
    let logged = cli.run(&[
        "events",
        "--db",
        &url,
        "--session",
        "served",
        "--json",
        "--limit",
        "1000",
    ]);
    assert!(logged.status.success(), "{}", stderr(&logged));
    assert_gapless(&parse_events(&logged.stdout), 1);
}

/// PostgreSQL stops under a running server: requests get `503
/// store_unavailable`, `/readyz` says not ready; once it is back the
/// server serves again by itself and nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgresql_outage_is_503_and_the_server_recovers_by_itself() {
    let Some(postgres) = LocalPostgres::own() else { return };
    let url = postgres.fresh_database();
    let cli = Cli::new();
    cli.script(
        "s.jsonl",
        &[r#"{"text": "One."}"#, r#"{"text": "Two."}"#, r#"{"text": "Three."}"#],
    );
    let server = ServeProcess::spawn(serve(&cli, &url));
    let model = format!("script:{}", cli.dir.path().join("s.jsonl").display());
    server.api.create(json!({"id": "s", "model": model})).await;
    let acknowledged = server.api.say("s", "before").await;
    server.api.wait_idle("s").await;

    postgres.stop();
    let refused = server
        .api
        .submit("s", json!({"op": {"type": "user_input", "text": "during"}}))
        .await;
    assert_eq!(refused.status.as_u16(), 503, "{}", refused.body);
    assert_eq!(refused.body["error"]["code"], "store_unavailable", "{}", refused.body);
    let listed = server.api.get("/v1/sessions").await;
    assert_eq!(listed.status.as_u16(), 503, "{}", listed.body);
    let ready = reqwest::get(server.api.url("/readyz")).await.expect("readyz");
    assert_eq!(ready.status().as_u16(), 503);

    postgres.start();
    // Back without a restart of keel: ready again, and the session serves.
    wait_until_async("/readyz to say ready again", HANG_GUARD, async || {
        let reply = reqwest::get(server.api.url("/readyz")).await.expect("readyz");
        reply.status().is_success()
    })
    .await;
    wait_until_async("the server to take a submission again", HANG_GUARD, async || {
        let reply = server
            .api
            .submit("s", json!({"op": {"type": "user_input", "text": "after"}}))
            .await;
        if reply.status.as_u16() == 202 {
            return true;
        }
        assert_eq!(reply.status.as_u16(), 503, "{}", reply.body);
        false
    })
    .await;
    server.api.wait_idle("s").await;
    let (status, _) = server.terminate();
    assert!(status.success(), "{status:?}");

    let logged = cli.run(&["events", "--db", &url, "--session", "s", "--json", "--limit", "1000"]);
    assert!(logged.status.success(), "{}", stderr(&logged));
    let log = parse_events(&logged.stdout);
    assert_gapless(&log, 1);
    let messages: Vec<String> = log
        .iter()
        .filter_map(|event| match &event.msg {
            keel::protocol::EventMsg::UserMessage(message) => Some(message.text.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(messages, ["before", "after"], "the refused message was never stored");
    assert!(
        log.iter()
            .any(|event| event.submission_id.as_deref() == acknowledged["submission_id"].as_str()),
        "the message acknowledged before the outage is in the log"
    );
}
