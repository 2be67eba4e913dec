//! schemathesis (PyPI, pinned in `.ci/python`) against a real `keel serve`
//! with a token: every phase (examples, coverage, fuzzing, stateful), every
//! check. Only the two endless routes are left out (they never answer
//! whole); `streamed.rs` checks them against the description instead.

use std::collections::BTreeSet;
use std::process::Command;

use reqwest::StatusCode;
use serde_json::Value;

use super::{committed, outside_tool};
use crate::suite::support::api::Api;
use crate::suite::support::server::{Scratch, ServeProcess};

/// How long schemathesis may run, in seconds: its fuzzing and stateful
/// phases repeat until this is spent.
const BUDGET_SECS: &str = "150";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_no_failure_against_a_live_server() {
    let test = "contract::schemathesis::schemathesis_finds_no_failure_against_a_live_server";
    let Some(schemathesis) = outside_tool(
        test,
        ".ci/python/venv/bin/schemathesis",
        "python3 -m venv .ci/python/venv && .ci/python/venv/bin/pip install -r .ci/python/requirements.txt",
    ) else {
        return;
    };
    let scratch = Scratch::new();
    let token = "contract-schemathesis-token";
    let token_file = scratch.dir.path().join("token");
    std::fs::write(&token_file, token).expect("write the token");
    let model = scratch.script("hello.jsonl", &[r#"{"text": "Hello!"}"#]);
    let mut server = ServeProcess::start(
        &scratch,
        &[
            "--model",
            &model,
            "--token-file",
            token_file.to_str().expect("UTF-8 path"),
        ],
    );
    let output = Command::new(schemathesis)
        .arg("run")
        .arg(committed())
        .args(["--url", &server.api.base])
        .args(["--header", &format!("Authorization: Bearer {token}")])
        .args(["--checks", "all"])
        .args(["--phases", "examples,coverage,fuzzing,stateful"])
        .args(["--exclude-operation-id", "stream_events"])
        .args(["--exclude-operation-id", "connect_websocket"])
        .args(["--max-time", BUDGET_SECS])
        // One worker: Hypothesis reads its strategies' lambdas with `ast`,
        // which CPython 3.11 does not make safe across threads ("AST
        // constructor recursion depth mismatch").
        .args(["--workers", "1"])
        .args(["--report", "har", "--report-har-path", "run.har"])
        .arg("--no-color")
        .env("SCHEMATHESIS_TELEMETRY", "false")
        .env("SCHEMATHESIS_HOOKS", "")
        .current_dir(scratch.dir.path())
        .output()
        .expect("run schemathesis");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // Nothing is stored from a refused request: the sessions stored are
    // exactly those the `201`s announced, less those a `204` deleted.
    let har: Value =
        serde_json::from_slice(&std::fs::read(scratch.dir.path().join("run.har")).expect("the HAR report"))
            .expect("HAR is JSON");
    let (expected, made) = sessions_left(&har);
    assert!(made > 10, "schemathesis made {made} sessions");
    server.api.token = Some(token.to_owned());
    let stored = stored_sessions(&server.api).await;
    if stored != expected {
        let differing: Vec<&String> = stored.symmetric_difference(&expected).collect();
        let requests: Vec<String> = har["log"]["entries"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|entry| differing.iter().any(|id| entry.to_string().contains(id.as_str())))
            .map(|entry| {
                format!(
                    "{} {} {} {} -> {}",
                    entry["startedDateTime"].as_str().unwrap_or_default(),
                    entry["request"]["method"].as_str().unwrap_or_default(),
                    entry["request"]["url"].as_str().unwrap_or_default(),
                    entry["request"]["postData"]["text"].as_str().unwrap_or_default(),
                    entry["response"]["status"]
                )
            })
            .collect();
        panic!(
            "the stored sessions are not those the answers announced: {differing:?} differ; their requests:\n{requests:#?}"
        );
    }
    let (status, stderr) = server.terminate();
    // The summary, where a person reading the test output looks for it.
    let summary = printed.rsplit("SUMMARY").next().unwrap_or_default();
    eprintln!("schemathesis summary:{summary}");
    assert!(
        output.status.success(),
        "schemathesis failed:\n{printed}\nkeel serve: {stderr:?}"
    );
    assert!(!printed.contains("FAILURES"), "{printed}");
    let warned = unexpected_warnings(&printed, &har);
    assert!(warned.is_empty(), "schemathesis warned: {warned:?}\n{printed}");
    // The last line counts what was found: nothing, or only the warnings
    // let through above.
    let last = printed
        .lines()
        .rev()
        .find(|line| !line.trim().is_empty())
        .unwrap_or_default();
    let only_warnings = [" 1 warning in ", " 2 warnings in "]
        .iter()
        .any(|count| last.contains(count));
    assert!(
        last.contains("No issues found") || (only_warnings && !last.contains("error") && !last.contains("fail")),
        "{printed}"
    );
    assert!(status.success(), "keel serve exited {status}: {stderr:?}");
    assert!(!stderr.iter().any(|line| line.contains("panicked")), "{stderr:?}");
}

/// The warnings schemathesis printed, less two that come whatever the API
/// does, each only when the run shows it for what it is:
///
/// - that a fork was only ever answered `404`. A fork succeeds only from a
///   session that exists and at a point of its log (the `at_sequence` of an
///   event it has, a `before_turn` of a turn it ran), which random data
///   seldom hits; `server::fork` covers the route.
/// - that an operation was mostly answered `429`, when every `429` of the
///   run is `budget_exhausted` and came after the run itself put a budget
///   (random limits on a tenant's or a session's budget spend it at once,
///   and from then on a turn is refused as it must be).
///
/// Any other warning, and these for other reasons or operations, is kept.
fn unexpected_warnings<'a>(printed: &'a str, har: &Value) -> Vec<&'a str> {
    let Some((_, rest)) = printed.split_once("= WARNINGS =") else {
        return Vec::new();
    };
    let section = rest.split("= SUMMARY =").next().unwrap_or_default();
    let budget_refusals_only = only_budget_refusals(har);
    let no_webhook_url_taken = only_refused_webhook_urls(har);
    let mut unexpected = Vec::new();
    for block in warning_blocks(section) {
        let (title, items) = (block[0], &block[1..]);
        let items: Vec<&str> = items
            .iter()
            .filter(|line| line.starts_with("  - "))
            .map(|line| line.trim_start_matches("  - "))
            .collect();
        let tolerated = if title.starts_with("Missing test data: ") {
            // Forks need an existing session and a point of its log; a
            // webhook's routes need a webhook, which no run made when
            // every URL it tried was refused.
            items.iter().all(|item| {
                *item == "POST /v1/sessions/{id}/fork" || (no_webhook_url_taken && item.contains("/v1/webhooks/{id}"))
            })
        } else if title.starts_with("Authentication failed: 1 operation returned only 401/403") {
            no_webhook_url_taken && items == ["POST /v1/webhooks"]
        } else if title.starts_with("Rate limited: ") {
            budget_refusals_only
        } else {
            false
        };
        if !tolerated {
            unexpected.extend(block);
        }
    }
    unexpected
}

/// The warnings section's blocks: each a title line (`Title: summary`)
/// and the lines under it (items, tips), blank lines left out.
fn warning_blocks(section: &str) -> Vec<Vec<&str>> {
    let mut blocks: Vec<Vec<&str>> = Vec::new();
    for line in section.lines().map(|line| line.trim_end_matches('=')) {
        if line.trim().is_empty() {
            continue;
        }
        let starts_block = !line.starts_with(' ') && !line.starts_with('💡') && line.contains(": ");
        match blocks.last_mut() {
            Some(block) if !starts_block => block.push(line),
            _ => blocks.push(vec![line]),
        }
    }
    blocks
}

/// Whether the run's every `429` answer is `budget_exhausted` and follows
/// a budget the run put (a `200` to a `PUT …/budget`); false if it had a
/// `429` of any other kind, or one before any budget was put.
fn only_budget_refusals(har: &Value) -> bool {
    let mut entries: Vec<&Value> = har["log"]["entries"].as_array().into_iter().flatten().collect();
    entries.sort_by_key(|entry| entry["startedDateTime"].as_str().unwrap_or_default().to_owned());
    let mut budget_put = false;
    for entry in entries {
        let method = entry["request"]["method"].as_str().unwrap_or_default();
        let url = entry["request"]["url"].as_str().unwrap_or_default();
        let path = url.split('?').next().unwrap_or_default();
        match entry["response"]["status"].as_u64().unwrap_or_default() {
            200 if method == "PUT" && path.ends_with("/budget") => budget_put = true,
            429 => {
                let body: Value = serde_json::from_str(entry["response"]["content"]["text"].as_str().unwrap_or("{}"))
                    .unwrap_or(Value::Null);
                if !budget_put || body["error"]["code"] != "budget_exhausted" {
                    return false;
                }
            }
            _ => {}
        }
    }
    true
}

/// Whether every `POST /v1/webhooks` of the run was refused for its URL
/// (`403 webhook_url_refused`: random URLs name hosts no resolver here
/// knows, or private and special addresses, which the server must refuse),
/// so that no webhook existed for its other routes to find.
fn only_refused_webhook_urls(har: &Value) -> bool {
    har["log"]["entries"].as_array().into_iter().flatten().all(|entry| {
        let method = entry["request"]["method"].as_str().unwrap_or_default();
        let url = entry["request"]["url"].as_str().unwrap_or_default();
        let path = url.split('?').next().unwrap_or_default();
        if method != "POST" || !path.ends_with("/v1/webhooks") {
            return true;
        }
        let body: Value =
            serde_json::from_str(entry["response"]["content"]["text"].as_str().unwrap_or("{}")).unwrap_or(Value::Null);
        match entry["response"]["status"].as_u64().unwrap_or_default() {
            403 => body["error"]["code"] == "webhook_url_refused",
            status => status != 201 && status != 401,
        }
    })
}

/// The sessions the recorded answers leave, in the order they were sent:
/// each `201` to a session's create or fork adds one (as does a `200` to
/// an AI SDK chat, made by its first message), each `204` to a session's
/// delete takes one away. Also how many were made.
fn sessions_left(har: &Value) -> (BTreeSet<String>, usize) {
    let mut entries: Vec<&Value> = har["log"]["entries"].as_array().expect("HAR entries").iter().collect();
    entries.sort_by_key(|entry| entry["startedDateTime"].as_str().unwrap_or_default().to_owned());
    let mut left = BTreeSet::new();
    let mut made = 0;
    for entry in entries {
        let method = entry["request"]["method"].as_str().unwrap_or_default();
        let url = entry["request"]["url"].as_str().unwrap_or_default();
        let status = entry["response"]["status"].as_u64().unwrap_or_default();
        let path = url
            .split_once("/v1/")
            .map_or("", |(_, path)| path)
            .split('?')
            .next()
            .unwrap_or_default();
        // Only the sessions' routes: `/v1/keys` answers `201` and `204` too.
        match (method, status) {
            ("POST", 201) if path.starts_with("sessions") => {
                let body: Value =
                    serde_json::from_str(entry["response"]["content"]["text"].as_str().unwrap_or("{}")).expect("JSON");
                left.insert(body["id"].as_str().expect("the made session's id").to_owned());
                made += 1;
            }
            // An AI SDK chat's first message creates the chat's session
            // (the operator's: the session id is the chat's `id`).
            // So does an AG-UI run that brings a user message, for its
            // `threadId` (one with nothing new is answered with a snapshot).
            ("POST", 200) if path == "ai-sdk/chat" || path == "ag-ui" => {
                let body: Value =
                    serde_json::from_str(entry["request"]["postData"]["text"].as_str().unwrap_or("{}")).expect("JSON");
                let (thread, creates) = match path {
                    "ag-ui" => (
                        "threadId",
                        body["messages"]
                            .as_array()
                            .is_some_and(|messages| messages.iter().any(|message| message["role"] == "user")),
                    ),
                    _ => ("id", true),
                };
                if let Some(id) = body[thread].as_str().filter(|_| creates) {
                    left.insert(id.to_owned());
                }
            }
            // A session's delete; a budget's (`…/budget`) deletes no session.
            ("DELETE", 204) if path.starts_with("sessions/") && !path.ends_with("/budget") => {
                let id = path.strip_prefix("sessions/").expect("a session's path");
                let id = percent_encoding::percent_decode_str(id).decode_utf8().expect("UTF-8");
                left.remove(id.as_ref());
            }
            _ => {}
        }
    }
    (left, made)
}

/// Every session the server lists, page by page.
async fn stored_sessions(api: &Api) -> BTreeSet<String> {
    let mut stored = BTreeSet::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(cursor) => format!("/v1/sessions?limit=500&cursor={cursor}"),
            None => "/v1/sessions?limit=500".to_owned(),
        };
        let page = api.get(&path).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        for session in page.body["sessions"].as_array().expect("sessions") {
            stored.insert(session["id"].as_str().expect("an id").to_owned());
        }
        match page.body["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return stored,
        }
    }
}
