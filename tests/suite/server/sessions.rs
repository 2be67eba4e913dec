//! Creating, showing and listing sessions; a turn through the API.

use keel::protocol::EventMsg;
use keel::store::{CheckpointStore, SqliteCheckpoint};
use reqwest::StatusCode;
use serde_json::json;

use crate::suite::support::api::Resume;
use crate::suite::support::events::{ends_turn, kinds};
use crate::suite::support::server::TestServer;
use crate::suite::support::wait::next_millisecond;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_created_session_keeps_its_settings_and_shows_only_its_context() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server.scratch.script("s.jsonl", &[r#"{"text": "Hi."}"#]);
    let created = server
        .api
        .create(json!({
            "id": "my-session-1",
            "model": model,
            "bot_id": "support-bot",
            "context": {"user": "u-42", "plan": "pro"},
            "instructions": "You are terse.",
            "tools": {"builtin": true, "write": false, "shell": false, "sandbox": "read-only"},
            "approvals": {"default": "ask", "tools": {"read_file": "auto"}},
            "on_busy": "steer"
        }))
        .await;
    assert_eq!(created["id"], "my-session-1");
    assert_eq!(created["bot_id"], "support-bot");
    assert_eq!(created["context"], json!({"user": "u-42", "plan": "pro"}));
    assert_eq!(created["model"], model.as_str());
    assert_eq!(created["on_busy"], "steer");
    assert_eq!(created["state"], "idle");
    assert_eq!(created["live"], true);
    assert_eq!(created["queued"], 0);
    assert_eq!(created["turns_completed"], 0);
    assert_eq!(created["pending_approvals"], json!([]));
    assert!(created["last_sequence"].as_u64().is_some_and(|sequence| sequence >= 1));
    assert!(created.get("settings").is_none(), "settings stay internal: {created}");
    assert_eq!(server.api.session("my-session-1").await["context"], created["context"]);
    // The session works in its own directory under the workspace root.
    assert!(server.scratch.workspaces().join("my-session-1").is_dir());

    let scratch = server.stop().await;
    // The settings are stored with the session, so it reloads with them.
    let store = SqliteCheckpoint::new(scratch.db()).expect("open");
    let summary = store
        .session_summary("my-session-1")
        .await
        .expect("read")
        .expect("stored");
    let settings = summary.context.settings.expect("settings are stored");
    assert_eq!(settings["model"], model.as_str());
    assert_eq!(settings["instructions"], "You are terse.");
    assert_eq!(settings["on_busy"], "steer");
    assert_eq!(settings["tools"]["sandbox"], "read-only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_runs_and_the_session_shows_its_counters() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server.scratch.script(
        "s.jsonl",
        &[r#"{"chunks": ["Hel", "lo."], "usage": {"input_tokens": 7, "output_tokens": 3}}"#],
    );
    let session = server.api.create(json!({"model": model})).await;
    let id = session["id"].as_str().expect("id").to_owned();
    assert_eq!(id.len(), 36, "a generated UUID: {id}");
    let mut stream = server.api.stream(&id, Resume::Start).await;
    let accepted = server.api.say(&id, "Hello").await;
    assert_eq!(accepted["duplicate"], false);
    let events = stream.until(ends_turn).await;
    let text: Vec<&str> = events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::AssistantMessage(message) => Some(message.text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(text, ["Hello."]);
    assert_eq!(kinds(&events).last(), Some(&"turn_complete"));
    server.api.wait_idle(&id).await;
    let shown = server.api.session(&id).await;
    assert_eq!(shown["turns_completed"], 1);
    assert_eq!(shown["usage"]["input_tokens"], 7);
    assert_eq!(shown["usage"]["output_tokens"], 3);
    assert_eq!(
        shown["last_sequence"],
        events.last().map(|event| event.sequence).unwrap_or(0)
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_listed_newest_first_page_by_page() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server.scratch.script("s.jsonl", &[r#"{"text": "Hi."}"#]);
    for id in ["first", "second", "third"] {
        server.api.create(json!({"id": id, "model": model})).await;
        // Creation times differ by at least a millisecond.
        next_millisecond();
    }
    let page = server.api.get("/v1/sessions?limit=2").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let ids: Vec<&str> = page.body["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|session| session["id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, ["third", "second"]);
    let cursor = page.body["next_cursor"].as_str().expect("a next page");
    let next = server
        .api
        .get(&format!("/v1/sessions?limit=2&cursor={}", urlencode(cursor)))
        .await;
    assert_eq!(next.status, StatusCode::OK, "{}", next.body);
    let ids: Vec<&str> = next.body["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|session| session["id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, ["first"]);
    assert!(next.body["next_cursor"].is_null());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_listed_by_bot() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server.scratch.script("s.jsonl", &[r#"{"text": "Hi."}"#]);
    for (id, bot) in [
        ("s1", "support"),
        ("b1", "billing"),
        ("s2", "support"),
        ("s3", "support"),
    ] {
        server
            .api
            .create(json!({"id": id, "model": model, "bot_id": bot}))
            .await;
    }
    let ids = |body: &serde_json::Value| -> Vec<String> {
        body["sessions"]
            .as_array()
            .expect("sessions")
            .iter()
            .map(|session| session["id"].as_str().expect("id").to_owned())
            .collect()
    };
    let page = server.api.get("/v1/sessions?bot_id=support&limit=2").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert_eq!(ids(&page.body), ["s3", "s2"]);
    let cursor = page.body["next_cursor"].as_str().expect("a next page");
    let next = server
        .api
        .get(&format!(
            "/v1/sessions?bot_id=support&limit=2&cursor={}",
            urlencode(cursor)
        ))
        .await;
    assert_eq!(ids(&next.body), ["s1"]);
    assert!(next.body["next_cursor"].is_null());
    let billing = server.api.get("/v1/sessions?bot_id=billing").await;
    assert_eq!(ids(&billing.body), ["b1"]);
    let nobody = server.api.get("/v1/sessions?bot_id=nobody").await;
    assert_eq!(ids(&nobody.body), Vec::<String>::new());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_pages_backwards_and_forwards() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server
        .scratch
        .script("s.jsonl", &[r#"{"chunks": ["a", "b", "c"], "delay_ms": 50}"#]);
    server.api.create(json!({"id": "paged", "model": model})).await;
    let mut stream = server.api.stream("paged", Resume::Start).await;
    server.api.say("paged", "Hello").await;
    let events = stream.until(ends_turn).await;
    let last = events.last().expect("events").sequence;
    assert!(last >= 8, "{:?}", kinds(&events));

    // A page's sequences, and whether it says there are more.
    let api = &server.api;
    let page = async |path: String| {
        let reply = api.get(&path).await;
        let sequences: Vec<u64> = reply.body["events"]
            .as_array()
            .expect("events")
            .iter()
            .map(|event| event["sequence"].as_u64().expect("sequence"))
            .collect();
        (sequences, reply.body["has_more"].clone())
    };
    assert_eq!(
        page("/v1/sessions/paged/events?limit=3".to_owned()).await,
        (vec![last - 2, last - 1, last], json!(true))
    );
    assert_eq!(
        page(format!("/v1/sessions/paged/events?before={}&limit=1000", last - 2)).await,
        ((1..last - 2).collect(), json!(false))
    );
    assert_eq!(
        page("/v1/sessions/paged/events?after=2&limit=3".to_owned()).await,
        (vec![3, 4, 5], json!(true))
    );
    assert_eq!(
        page(format!("/v1/sessions/paged/events?after={}", last - 1)).await,
        (vec![last], json!(false))
    );
    // Both bounds: the window between them, paged forwards.
    assert_eq!(
        page("/v1/sessions/paged/events?after=2&before=5".to_owned()).await,
        (vec![3, 4], json!(false))
    );
    assert_eq!(
        page("/v1/sessions/paged/events?after=2&before=8&limit=2".to_owned()).await,
        (vec![3, 4], json!(true))
    );
    assert_eq!(
        page("/v1/sessions/paged/events?after=4&before=5".to_owned()).await,
        (vec![], json!(false))
    );
    server.stop().await;
}

/// Percent-encodes everything but unreserved characters.
fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (byte as char).to_string(),
            _ => format!("%{byte:02X}"),
        })
        .collect()
}
