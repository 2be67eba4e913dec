//! The store's file system under a running `keel serve`, changed from
//! outside the store the way a sandboxed command could change it: filled
//! to the last block (`dd`), or its `-shm` made immutable (`chattr +i`).
//! Real file systems (a tmpfs, ext4 on a loop device), mounted as root;
//! without the permission they skip like `store_faults`.

use std::time::Duration;

use keel::store::SqliteCheckpoint;
use keel::store::sqlite::SpaceReserve;
use reqwest::StatusCode;
use serde_json::json;

use crate::suite::store_faults::{Mount, fill, or_skip, run, serve_with};
use crate::suite::support::api::Api;
use crate::suite::support::server::Scratch;
use crate::suite::support::store::{assert_integrity_ok, stored_events_in};
use crate::suite::support::wait::poll_for_async;

/// Text that LZ4 cannot shrink, so that storing it needs new pages.
fn incompressible(bytes: usize) -> String {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from(b'a' + (state % 26) as u8)
        })
        .collect()
}

/// Waits until `/readyz` answers `status`; returns its body.
async fn readyz_becomes(api: &Api, status: StatusCode) -> serde_json::Value {
    let mut last = None;
    let body = poll_for_async(Duration::from_secs(30), async || {
        let reply = api.get("/readyz").await;
        if reply.status == status {
            return Some(reply.body);
        }
        last = Some((reply.status, reply.body));
        None
    })
    .await;
    body.unwrap_or_else(|| panic!("/readyz never answered {status}: {last:?}"))
}

/// The finding: `dd` from a sandboxed command filled the database's file
/// system, and then every session got `503 store_full` while `/readyz`
/// said ready. Now the store's reserve lets a session commit its turn on
/// the full disk, `/readyz` says the store is short of space, and once the
/// space is back the reserve is made again and the server is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_filled_from_outside_leaves_the_store_its_reserve() {
    let test = "a_disk_filled_from_outside_leaves_the_store_its_reserve";
    let Some(mount) = or_skip(test, Mount::tmpfs("48m")) else {
        return;
    };
    let scratch = Scratch::new();
    let db = mount.path().join("keel.sqlite3");
    let server = serve_with(db.as_os_str(), &scratch, &["--store-reserve-mb", "8"]);
    let api = &server.api;
    let model = scratch.script("s.jsonl", &[r#"{"text": "one"}"#, r#"{"text": "two"}"#]);
    api.create(json!({"id": "s", "model": model})).await;
    api.say("s", "first").await;
    api.wait_idle("s").await;
    assert_eq!(api.get("/readyz").await.status, StatusCode::OK);
    let ballast = SpaceReserve::path_for(&db);
    assert_eq!(std::fs::metadata(&ballast).expect("the ballast").len(), 8 * 1024 * 1024);

    // A tool fills the file system, from outside the store.
    let filler = mount.path().join("filler");
    fill(&filler);
    let why = readyz_becomes(api, StatusCode::SERVICE_UNAVAILABLE).await;
    assert_eq!(why["error"]["code"], "store_full", "{why}");
    assert!(
        why["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("reserve")),
        "{why}"
    );

    // A session still commits a whole turn, on the room the reserve kept.
    let text = incompressible(256 * 1024);
    let reply = api
        .submit("s", json!({"op": {"type": "user_input", "text": text}}))
        .await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    api.wait_idle("s").await;
    assert_eq!(api.session("s").await["turns_completed"], 2);
    // The reserve is used up: still not ready.
    assert_eq!(api.get("/readyz").await.status, StatusCode::SERVICE_UNAVAILABLE);

    // The space comes back: the reserve is made again, and all is ready.
    std::fs::remove_file(&filler).expect("remove the filler");
    readyz_becomes(api, StatusCode::OK).await;
    assert_eq!(std::fs::metadata(&ballast).expect("the ballast").len(), 8 * 1024 * 1024);
    let (status, lines) = server.terminate();
    assert!(status.success(), "{status:?}: {lines:#?}");
    assert!(
        lines.iter().any(|line| line.contains("space reserve was released")),
        "the commit on the full disk used the reserve: {lines:#?}"
    );

    assert_integrity_ok(&db);
    let store = SqliteCheckpoint::new(&db).expect("open the store");
    let log = stored_events_in(&store, "s").await;
    assert!(
        log.iter()
            .any(|event| serde_json::to_string(&event.msg).is_ok_and(|json| json.contains(&text[..64]))),
        "the message sent on the full disk is stored"
    );
    store.close().await;
}

/// The finding: an immutable `-shm` made while `keel serve` runs killed it
/// with `SIGBUS` at the next write (it was checked only at start). Now the
/// server stays up, refuses writes and reads with `503`, says not ready,
/// and serves again once the flag is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_immutable_shm_under_a_running_server_is_503_not_sigbus() {
    let test = "an_immutable_shm_under_a_running_server_is_503_not_sigbus";
    let Some(mount) = or_skip(test, Mount::ext4(64)) else {
        return;
    };
    let scratch = Scratch::new();
    let db = mount.path().join("keel.sqlite3");
    let server = serve_with(db.as_os_str(), &scratch, &["--store-reserve-mb", "0"]);
    let api = &server.api;
    let line = r#"{"text": "Stored."}"#;
    let model = scratch.script("s.jsonl", &[line; 8]);
    api.create(json!({"id": "s", "model": model})).await;
    api.say("s", "first").await;
    api.wait_idle("s").await;
    assert_eq!(api.get("/readyz").await.status, StatusCode::OK);

    let shm = format!("{}-shm", db.display());
    run("chattr", &["+i".as_ref(), shm.as_ref()]).expect("chattr +i");
    for n in 0..5 {
        let reply = api
            .submit(
                "s",
                json!({"op": {"type": "user_input", "text": format!("frozen {n}")}}),
            )
            .await;
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{}", reply.body);
        assert_eq!(reply.code(), "store_unavailable", "{}", reply.body);
    }
    let why = api.get("/readyz").await;
    assert_eq!(why.status, StatusCode::SERVICE_UNAVAILABLE, "{}", why.body);
    assert!(why.body.to_string().contains("-shm"), "{}", why.body);
    assert_eq!(api.get("/healthz").await.status, StatusCode::OK, "the server is alive");

    run("chattr", &["-i".as_ref(), shm.as_ref()]).expect("chattr -i");
    readyz_becomes(api, StatusCode::OK).await;
    api.say("s", "thawed").await;
    api.wait_idle("s").await;
    let (status, lines) = server.terminate();
    assert!(status.success(), "{status:?}: {lines:#?}");
    assert_integrity_ok(&db);
}

/// While the store's file system is below its reserve (a command filled
/// it), no tool runs: a shell call or a file write could take the room
/// the log's commits need. The calls are answered "not run" with the
/// reason, the turn completes, and once space is back tools run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_tool_runs_while_the_store_is_short_of_space() {
    let test = "no_tool_runs_while_the_store_is_short_of_space";
    let Some(mount) = or_skip(test, Mount::tmpfs("48m")) else {
        return;
    };
    let scratch = Scratch::new();
    let db = mount.path().join("keel.sqlite3");
    let server = serve_with(
        db.as_os_str(),
        &scratch,
        &["--store-reserve-mb", "8", "--auto-approve", "*"],
    );
    let api = &server.api;
    let calls = |n: u32| {
        json!({"tool_calls": [
            {"id": format!("shell-{n}"), "name": "shell", "arguments": {"command": format!("echo ran > shell-{n}.txt")}},
            {"id": format!("write-{n}"), "name": "write_file", "arguments": {"path": format!("write-{n}.txt"), "content": "x"}},
        ]})
        .to_string()
    };
    let (first, second) = (calls(1), calls(2));
    let model = scratch.script(
        "s.jsonl",
        &[&first, r#"{"text": "one"}"#, &second, r#"{"text": "two"}"#],
    );
    api.create(json!({"id": "s", "model": model, "approvals": {"default": "auto"}}))
        .await;
    let filler = mount.path().join("filler");
    fill(&filler);
    readyz_becomes(api, StatusCode::SERVICE_UNAVAILABLE).await;
    api.say("s", "while full").await;
    api.wait_idle("s").await;
    let workspace = scratch.workspaces().join("s");
    for name in ["shell-1.txt", "write-1.txt"] {
        assert!(!workspace.join(name).exists(), "{name} was written on a full store");
    }

    std::fs::remove_file(&filler).expect("remove the filler");
    readyz_becomes(api, StatusCode::OK).await;
    api.say("s", "with room").await;
    api.wait_idle("s").await;
    for name in ["shell-2.txt", "write-2.txt"] {
        assert!(
            workspace.join(name).exists(),
            "{name} was not written once space was back"
        );
    }
    let (status, lines) = server.terminate();
    assert!(status.success(), "{status:?}: {lines:#?}");
    let store = SqliteCheckpoint::new(&db).expect("open the store");
    let log = stored_events_in(&store, "s").await;
    store.close().await;
    let refused: Vec<String> = log
        .iter()
        .filter_map(|event| match &event.msg {
            keel::EventMsg::ToolCallCompleted(done) if done.call_id.ends_with("-1") => Some(done.output.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(
        refused
            .iter()
            .all(|output| output.starts_with("not run: ") && output.contains("reserve")),
        "{refused:?}"
    );
}
