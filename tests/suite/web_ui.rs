//! The web UI of `keel serve` in a real headless Chromium: Debian's
//! `chromium` driven by `playwright-core` (from `.ci/node`, launched with the
//! system browser's path, never a downloaded one). Each test starts the real
//! `keel serve` binary with a scripted model, runs one browser scenario from
//! `tests/web/` with `node`, and then checks the server's log through the
//! HTTP API. The scenario's assertions run in the browser; a failing one
//! fails the test with the script's output in the panic message.
//!
//! Without node, playwright-core or Chromium these tests fail and say how
//! to install them. For local development without a browser,
//! `KEEL_SKIP_BROWSER_TESTS=1` makes them pass with a `SKIPPED` line on the
//! terminal instead (see [`crate::suite::support::skip`]);
//! CI (`CI` or `KEEL_REQUIRE_BROWSER_TESTS` set, as `.ci/run` does) never
//! skips them.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::suite::support::api::Api;
use crate::suite::support::server::{Scratch, ServeProcess};
use crate::suite::support::skip;
use crate::suite::support::wait::{next_millisecond, wait_until_async};

mod client_tools;
mod principals;
mod sidebar;

/// One browser at a time: Chromium is heavy on a two-core machine, and the
/// scenarios watch text stream in.
static BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The longest a scenario may run before it is killed and the test fails.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(150);

/// What the browser scenarios need, found or explained.
pub(crate) struct Tools {
    node_modules: PathBuf,
    chromium: PathBuf,
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Whether the environment asks to skip the browser tests, and may.
fn skipping() -> bool {
    skip::set("KEEL_SKIP_BROWSER_TESTS") && skip::may_skip("KEEL_REQUIRE_BROWSER_TESTS")
}

/// Finds node, playwright-core and Chromium; panics with how to install
/// whatever is missing, or answers `None` (after saying so loudly) when
/// `KEEL_SKIP_BROWSER_TESTS=1` allows skipping.
fn tools(test: &str) -> Option<Tools> {
    if skipping() {
        skip::announce(
            test,
            "KEEL_SKIP_BROWSER_TESTS is set, so the web UI is NOT tested in a browser. Unset it (CI always runs \
             these) once Chromium and `npm ci --prefix .ci/node` are in place.",
        );
        return None;
    }
    let node = std::process::Command::new("node").arg("--version").output();
    assert!(
        node.as_ref().is_ok_and(|output| output.status.success()),
        "the web UI tests need Node.js (20 or later) on PATH: install it (Debian: `apt-get install -y nodejs npm`), \
         or set KEEL_SKIP_BROWSER_TESTS=1 to skip them locally; {node:?}"
    );
    let node_modules = std::env::var_os("KEEL_WEB_NODE_MODULES")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".ci/node/node_modules"));
    assert!(
        node_modules.join("playwright-core/package.json").is_file(),
        "the web UI tests need playwright-core in {}: run `npm ci --prefix .ci/node` (the install step of .ci/run), \
         or point KEEL_WEB_NODE_MODULES at a node_modules that has it, or set KEEL_SKIP_BROWSER_TESTS=1 to skip \
         them locally",
        node_modules.display()
    );
    let chromium = std::env::var_os("KEEL_CHROMIUM")
        .map(PathBuf::from)
        .or_else(|| on_path("chromium"));
    let chromium = chromium.filter(|path| path.is_file()).unwrap_or_else(|| {
        panic!(
            "the web UI tests need Chromium: install Debian's package (`apt-get install -y chromium`, as .ci/run \
             does), or point KEEL_CHROMIUM at a Chromium binary, or set KEEL_SKIP_BROWSER_TESTS=1 to skip them \
             locally"
        )
    });
    Some(Tools { node_modules, chromium })
}

/// What a browser test runs with: the tools, the browser to itself, and a
/// scratch directory; `None` when the browser tests are skipped.
pub(crate) async fn browser_test(test: &str) -> Option<(Tools, tokio::sync::MutexGuard<'static, ()>, Scratch)> {
    let tools = tools(test)?;
    let browser = BROWSER.lock().await;
    Some((tools, browser, Scratch::new()))
}

/// What a scenario printed, and the JSON of its `RESULT` line.
pub(crate) struct Outcome {
    pub(crate) result: Value,
    pub(crate) output: String,
}

/// Runs `tests/web/{name}.mjs` against `base` with `params`; panics with
/// its output unless it passed.
pub(crate) async fn scenario(tools: &Tools, name: &str, base: &str, params: Value) -> Outcome {
    scenario_within(tools, name, base, params, SCENARIO_TIMEOUT).await
}

/// [`scenario`], killed and failed after `timeout` instead of the usual.
pub(crate) async fn scenario_within(
    tools: &Tools,
    name: &str,
    base: &str,
    params: Value,
    timeout: Duration,
) -> Outcome {
    let script = repo().join("tests/web").join(format!("{name}.mjs"));
    let artifacts = Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-ui");
    let started = Instant::now();
    let child = tokio::process::Command::new("node")
        .arg(&script)
        .arg(base)
        .arg(params.to_string())
        .env("KEEL_CHROMIUM", &tools.chromium)
        .env("KEEL_WEB_NODE_MODULES", &tools.node_modules)
        .env("KEEL_WEB_ARTIFACTS", &artifacts)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|error| panic!("cannot run node {}: {error}", script.display()));
    let output = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("the browser scenario {name} ran longer than {timeout:?}"))
        .expect("wait for node");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let text = format!("--- stdout\n{stdout}--- stderr\n{stderr}");
    assert!(
        output.status.success(),
        "the browser scenario {name} failed ({}) after {:?}:\n{text}",
        output.status,
        started.elapsed()
    );
    let result = stdout
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix("RESULT "))
        .and_then(|json| serde_json::from_str(json).ok())
        .unwrap_or_else(|| panic!("the browser scenario {name} printed no RESULT line:\n{text}"));
    // Shown with `--nocapture`: what the scenario logged on its way.
    eprintln!("browser scenario {name}: {:?}\n{stdout}", started.elapsed());
    Outcome { result, output: text }
}

/// The whole log of a session, through `GET /v1/sessions/{id}/events`.
pub(crate) async fn log_of(api: &Api, session_id: &str) -> Vec<Value> {
    let mut events: Vec<Value> = Vec::new();
    loop {
        let after = events
            .last()
            .map_or(0, |event| event["sequence"].as_u64().expect("sequence"));
        let reply = api
            .get(&format!("/v1/sessions/{session_id}/events?after={after}&limit=1000"))
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        events.extend(reply.body["events"].as_array().expect("events").iter().cloned());
        if reply.body["has_more"] != true {
            return events;
        }
    }
}

/// The events of `kind` in `log`.
pub(crate) fn of_kind<'a>(log: &'a [Value], kind: &str) -> Vec<&'a Value> {
    log.iter().filter(|event| event["msg"]["type"] == kind).collect()
}

/// The string a scenario reported as `key` in its RESULT.
pub(crate) fn reported(outcome: &Outcome, key: &str) -> String {
    outcome.result[key]
        .as_str()
        .unwrap_or_else(|| panic!("no {key} in the RESULT:\n{}", outcome.output))
        .to_owned()
}

/// The session id a scenario reported.
pub(crate) fn session_of(outcome: &Outcome) -> String {
    reported(outcome, "session_id")
}

/// A script line streaming `chunks` `delay_ms` apart.
pub(crate) fn chunks_line(chunks: &[&str], delay_ms: u64) -> String {
    json!({"chunks": chunks, "delay_ms": delay_ms}).to_string()
}

/// `count` numbered words, streamed `delay_ms` apart; and their text.
pub(crate) fn slow_words(count: usize, delay_ms: u64) -> (String, String) {
    let words: Vec<String> = (1..=count).map(|index| format!("word{index} ")).collect();
    let text = words.concat();
    (json!({"chunks": words, "delay_ms": delay_ms}).to_string(), text)
}

pub(crate) fn serve(scratch: &Scratch, model: &str, extra: &[&str]) -> ServeProcess {
    let mut args = vec!["--model", model];
    args.extend_from_slice(extra);
    ServeProcess::start(scratch, &args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_creates_a_session_and_streams_the_answer() {
    let Some((tools, _browser, scratch)) = browser_test("web_ui_creates_a_session_and_streams_the_answer").await else {
        return;
    };
    let chunks = [
        "Streaming ",
        "answers ",
        "arrive ",
        "piece ",
        "by ",
        "piece, ",
        "each ",
        "one ",
        "stored ",
        "before ",
        "the ",
        "browser ",
        "sees ",
        "it.",
    ];
    let full_text = chunks.concat();
    let model = scratch.script("stream.jsonl", &[&chunks_line(&chunks, 120)]);
    let server = serve(&scratch, &model, &[]);

    let outcome = scenario(
        &tools,
        "create_and_stream",
        &server.api.base,
        json!({"bot": "web-ui-bot", "full_text": full_text}),
    )
    .await;

    let id = session_of(&outcome);
    let session = server.api.session(&id).await;
    assert_eq!(session["bot_id"], "web-ui-bot");
    assert_eq!(session["turns_completed"], 1);
    let log = log_of(&server.api, &id).await;
    let users = of_kind(&log, "user_message");
    assert_eq!(users.len(), 1);
    assert_eq!(
        users[0]["msg"]["text"], "line one\nline two",
        "Shift+Enter is a line break"
    );
    assert!(of_kind(&log, "assistant_content_delta").len() >= 3, "{log:#?}");
    let answers = of_kind(&log, "assistant_message");
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0]["msg"]["text"], full_text);
    assert_eq!(of_kind(&log, "turn_complete").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_lists_sessions_newest_first_page_by_page() {
    let Some((tools, _browser, scratch)) = browser_test("web_ui_lists_sessions_newest_first_page_by_page").await else {
        return;
    };
    let model = scratch.script("list.jsonl", &[r#"{"text": "hi"}"#]);
    let server = serve(&scratch, &model, &[]);
    let ids: Vec<String> = (1..=5).map(|index| format!("listed-{index}")).collect();
    for id in &ids {
        server.api.create(json!({"id": id})).await;
        // Distinct creation times, so "newest first" has one answer.
        next_millisecond();
    }
    let listed = server.api.get("/v1/sessions?limit=5").await;
    let newest_first: Vec<&str> = listed.body["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|session| session["id"].as_str().expect("id"))
        .collect();
    assert_eq!(
        newest_first,
        ["listed-5", "listed-4", "listed-3", "listed-2", "listed-1"]
    );

    scenario(
        &tools,
        "session_list",
        &server.api.base,
        json!({"newest_first": newest_first, "open": "listed-3"}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_interrupts_a_slow_turn() {
    let Some((tools, _browser, scratch)) = browser_test("web_ui_interrupts_a_slow_turn").await else {
        return;
    };
    let (slow, _) = slow_words(200, 50);
    // The page shows the model spec: a long path with nowhere to break a
    // line must not push the Interrupt button out of its column.
    let long_dir = "scriptsofthisscenariokeptinadirectorywithaverylongnamewithoutanyhyphen";
    std::fs::create_dir_all(scratch.dir.path().join(long_dir)).expect("script directory");
    let model = scratch.script(
        &format!("{long_dir}/slow.jsonl"),
        &[&slow, &slow, r#"{"text": "Third time lucky."}"#],
    );
    let server = serve(&scratch, &model, &[]);

    let outcome = scenario(
        &tools,
        "interrupt",
        &server.api.base,
        json!({"final_text": "Third time lucky."}),
    )
    .await;

    let id = session_of(&outcome);
    let log = log_of(&server.api, &id).await;
    let aborted = of_kind(&log, "turn_aborted");
    assert_eq!(aborted.len(), 2, "{log:#?}");
    for event in &aborted {
        assert_eq!(event["msg"]["reason"], "interrupted");
    }
    // The first turn was stopped by the button, the second by a message
    // sent with the busy policy `interrupt`.
    let queued: Vec<&Value> = of_kind(&log, "submission_queued");
    let policies: Vec<&str> = queued
        .iter()
        .map(|event| event["msg"]["on_busy"].as_str().expect("on_busy"))
        .collect();
    assert_eq!(policies, ["queue", "queue", "interrupt"]);
    let first_turn = aborted[0]["msg"]["turn_id"].clone();
    let streamed: String = of_kind(&log, "assistant_content_delta")
        .iter()
        .filter(|event| event["msg"]["turn_id"] == first_turn)
        .map(|event| event["msg"]["delta"].as_str().expect("delta"))
        .collect();
    assert_eq!(
        outcome.result["interrupted_text"], streamed,
        "the page shows exactly what the interrupted turn streamed"
    );
    let answers = of_kind(&log, "assistant_message");
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0]["msg"]["text"], "Third time lucky.");
    assert_eq!(server.api.session(&id).await["state"], "idle");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_approves_denies_and_always_approves_tool_calls() {
    let Some((tools, _browser, scratch)) = browser_test("web_ui_approves_denies_and_always_approves_tool_calls").await
    else {
        return;
    };
    let write = |path: &str, content: &str| {
        json!({"tool_calls": [{"name": "write_file", "arguments": {"path": path, "content": content}}]}).to_string()
    };
    let lines = [
        write("approved.txt", "approved from the browser"),
        r#"{"text": "Wrote approved.txt."}"#.to_owned(),
        write("denied.txt", "never written"),
        r#"{"text": "I did not write it."}"#.to_owned(),
        write("always-1.txt", "one"),
        write("always-2.txt", "two"),
        r#"{"text": "Both written."}"#.to_owned(),
    ];
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let model = scratch.script("tools.jsonl", &lines);
    let server = serve(&scratch, &model, &[]);

    let outcome = scenario(&tools, "approvals", &server.api.base, json!({})).await;

    let id = session_of(&outcome);
    let workspace = scratch.workspaces().join(&id);
    let read = |name: &str| std::fs::read_to_string(workspace.join(name)).ok();
    assert_eq!(read("approved.txt").as_deref(), Some("approved from the browser"));
    assert_eq!(read("denied.txt"), None, "a denied call never runs");
    assert_eq!(read("always-1.txt").as_deref(), Some("one"));
    assert_eq!(read("always-2.txt").as_deref(), Some("two"));
    let log = log_of(&server.api, &id).await;
    assert_eq!(
        of_kind(&log, "approval_requested").len(),
        3,
        "the call after `Always` needs no approval"
    );
    let decisions: Vec<&str> = of_kind(&log, "approval_decided")
        .iter()
        .map(|event| event["msg"]["decision"].as_str().expect("decision"))
        .collect();
    assert_eq!(decisions, ["approve", "deny", "approve_for_session"]);
    let errors: Vec<bool> = of_kind(&log, "tool_call_completed")
        .iter()
        .map(|event| event["msg"]["is_error"].as_bool().expect("is_error"))
        .collect();
    assert_eq!(errors, [false, true, false, false]);
    assert_eq!(of_kind(&log, "turn_complete").len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_reloaded_mid_stream_shows_every_event_once() {
    let Some((tools, _browser, scratch)) = browser_test("web_ui_reloaded_mid_stream_shows_every_event_once").await
    else {
        return;
    };
    let (slow, full_text) = slow_words(60, 100);
    let model = scratch.script("reload.jsonl", &[&slow]);
    let server = serve(&scratch, &model, &[]);

    let outcome = scenario(&tools, "reload", &server.api.base, json!({"full_text": full_text})).await;

    let id = session_of(&outcome);
    let log = log_of(&server.api, &id).await;
    let last = log.last().expect("events")["sequence"].as_u64().expect("sequence");
    let expected: Vec<Value> = log
        .iter()
        .map(|event| json!({"sequence": event["sequence"], "kind": event["msg"]["type"]}))
        .collect();
    assert_eq!(
        outcome.result["timeline"],
        json!(expected),
        "the reloaded page lists the whole log, each sequence once, in order"
    );
    assert_eq!(
        expected
            .iter()
            .map(|entry| entry["sequence"].as_u64())
            .collect::<Vec<_>>(),
        (1..=last).map(Some).collect::<Vec<_>>(),
        "the log's sequences are 1..{last}"
    );
    assert!(
        outcome.result["rendered_before_reload"].as_u64().expect("count") < last,
        "the page was reloaded before the turn ended"
    );
    let answers = of_kind(&log, "assistant_message");
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0]["msg"]["text"], full_text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_asks_for_the_token_once_and_keeps_it() {
    let Some((tools, _browser, scratch)) = browser_test("web_ui_asks_for_the_token_once_and_keeps_it").await else {
        return;
    };
    let token = "web-ui-s3cret";
    let token_file = scratch.dir.path().join("token");
    std::fs::write(&token_file, format!("{token}\n")).expect("write the token file");
    let chunks = ["Only ", "with ", "the ", "right ", "token."];
    let model = scratch.script("token.jsonl", &[&chunks_line(&chunks, 80)]);
    let token_arg = token_file.display().to_string();
    let mut server = serve(&scratch, &model, &["--token-file", &token_arg]);
    assert_eq!(
        server.api.get("/v1/sessions").await.status,
        StatusCode::UNAUTHORIZED,
        "the server wants the token"
    );

    let outcome = scenario(
        &tools,
        "token",
        &server.api.base,
        json!({"token": token, "full_text": chunks.concat()}),
    )
    .await;

    server.api.token = Some(token.to_owned());
    let id = session_of(&outcome);
    let log = log_of(&server.api, &id).await;
    let answers = of_kind(&log, "assistant_message");
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0]["msg"]["text"], chunks.concat());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_resumes_its_stream_after_a_server_restart() {
    let Some((tools, _browser, scratch)) = browser_test("web_ui_resumes_its_stream_after_a_server_restart").await
    else {
        return;
    };
    let first = ["Said ", "before ", "the ", "restart."];
    let second = ["Said ", "after ", "it."];
    let model = scratch.script("restart.jsonl", &[&chunks_line(&first, 40), &chunks_line(&second, 40)]);
    let server = serve(&scratch, &model, &[]);
    let base = server.api.base.clone();
    let listen = base.trim_start_matches("http://").to_owned();
    let signals = scratch.dir.path().join("signals");
    std::fs::create_dir_all(&signals).expect("create the signal directory");

    // The page asks for the restart by writing a file; the same address and
    // database come back, and a file says so.
    let restart = async {
        let asked = signals.join("restart");
        wait_until_async("the page to ask for the restart", SCENARIO_TIMEOUT, async || {
            asked.exists()
        })
        .await;
        let (status, stderr) = tokio::task::block_in_place(|| server.terminate());
        assert!(status.success(), "keel serve exited with {status}: {stderr:#?}");
        let again = tokio::task::block_in_place(|| serve(&scratch, &model, &["--listen", &listen]));
        std::fs::write(signals.join("restarted"), "").expect("write the signal");
        again
    };
    let (outcome, server) = tokio::join!(
        scenario(
            &tools,
            "restart",
            &base,
            json!({
                "signal_dir": signals,
                "first_text": first.concat(),
                "second_text": second.concat(),
            }),
        ),
        restart,
    );

    let id = session_of(&outcome);
    let log = log_of(&server.api, &id).await;
    let expected: Vec<Value> = log
        .iter()
        .map(|event| json!({"sequence": event["sequence"], "kind": event["msg"]["type"]}))
        .collect();
    assert_eq!(outcome.result["timeline"], json!(expected));
    let answers: Vec<&Value> = of_kind(&log, "assistant_message")
        .iter()
        .map(|event| &event["msg"]["text"])
        .collect();
    assert_eq!(answers, [&json!(first.concat()), &json!(second.concat())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_renders_markdown_safely_and_fits_a_phone() {
    let Some((tools, _browser, scratch)) = browser_test("web_ui_renders_markdown_safely_and_fits_a_phone").await else {
        return;
    };
    let answer = "Here is **bold** and `inline`.\n\n```rust\nfn main() {}\n```\n\n\
                  <img src=x onerror=\"window.__pwned = 1\"> <script>window.__pwned = 2</script>\n\n\
                  See [the docs](https://example.com/docs).";
    let model = scratch.script("markdown.jsonl", &[&json!({ "text": answer }).to_string()]);
    let server = serve(&scratch, &model, &[]);
    let outcome = scenario(&tools, "markdown", &server.api.base, json!({})).await;
    assert!(outcome.result.is_object(), "{}", outcome.output);
}

/// The text of the `user_message`s of `log`.
fn user_texts(log: &[Value]) -> Vec<&str> {
    of_kind(log, "user_message")
        .iter()
        .map(|event| event["msg"]["text"].as_str().expect("text"))
        .collect()
}

/// The text of the `assistant_message`s of `log`.
pub(crate) fn answer_texts(log: &[Value]) -> Vec<&str> {
    of_kind(log, "assistant_message")
        .iter()
        .map(|event| event["msg"]["text"].as_str().expect("text"))
        .collect()
}

/// The sequences of the events of `log` that ended a turn.
fn turn_ends(log: &[Value]) -> Vec<u64> {
    log.iter()
        .filter(|event| event["msg"]["type"] == "turn_complete" || event["msg"]["type"] == "turn_aborted")
        .map(|event| event["sequence"].as_u64().expect("sequence"))
        .collect()
}

/// A fork's id from a scenario's RESULT.
fn fork_of(outcome: &Outcome) -> String {
    reported(outcome, "fork_id")
}

/// A model script `name` in `scratch` that answers `answers`, one a call.
pub(crate) fn answering(scratch: &Scratch, name: &str, answers: &[impl AsRef<str>]) -> String {
    let lines: Vec<String> = answers
        .iter()
        .map(|text| json!({ "text": text.as_ref() }).to_string())
        .collect();
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    scratch.script(name, &lines)
}

/// The logs of the parent and of the fork a scenario reported, once it is
/// checked that the fork's log begins with its `session_forked` event,
/// which names the parent and forks where the parent's first turn ended,
/// with that exchange's two history items.
async fn fork_logs(api: &Api, outcome: &Outcome) -> (Vec<Value>, Vec<Value>) {
    let parent = session_of(outcome);
    let parent_log = log_of(api, &parent).await;
    let fork_log = log_of(api, &fork_of(outcome)).await;
    let forked = &fork_log[0]["msg"];
    assert_eq!(forked["type"], "session_forked", "{fork_log:#?}");
    assert_eq!(forked["parent_session_id"], json!(parent));
    assert_eq!(
        forked["at_sequence"],
        json!(turn_ends(&parent_log)[0]),
        "the fork starts where the first exchange ended"
    );
    assert_eq!(forked["history_items"], 2, "the first exchange");
    (parent_log, fork_log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_renders_markdown_while_it_streams() {
    let Some((tools, _browser, scratch)) = browser_test("web_ui_renders_markdown_while_it_streams").await else {
        return;
    };
    let chunks = [
        "Some ",
        "**bold** ",
        "text.\n\n",
        "```js\n",
        "let x = 1;\n",
        "```\n\n",
        "<b>raw</b> <img src=x onerror=\"window.__pwned = 1\"> ",
        "and ",
        "the ",
        "end.",
    ];
    let model = scratch.script("streaming-markdown.jsonl", &[&chunks_line(&chunks, 250)]);
    let server = serve(&scratch, &model, &[]);
    let outcome = scenario(
        &tools,
        "streaming_markdown",
        &server.api.base,
        json!({"code": "let x = 1;\n"}),
    )
    .await;
    let log = log_of(&server.api, &session_of(&outcome)).await;
    assert_eq!(answer_texts(&log), [chunks.concat()]);
    assert!(
        of_kind(&log, "assistant_content_delta").len() >= chunks.len(),
        "{log:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_regenerates_the_last_answer_and_shows_it_after_a_reload() {
    let Some((tools, _browser, scratch)) =
        browser_test("web_ui_regenerates_the_last_answer_and_shows_it_after_a_reload").await
    else {
        return;
    };
    let (first, second) = ("The first answer.", "A **better** answer.");
    let model = scratch.script(
        "regenerate.jsonl",
        &[
            &json!({"text": first}).to_string(),
            &chunks_line(&["A ", "**better** ", "answer."], 100),
        ],
    );
    let server = serve(&scratch, &model, &[]);
    let question = "Tell me something";
    let outcome = scenario(
        &tools,
        "regenerate",
        &server.api.base,
        json!({"question": question, "first": first, "second": "A better answer."}),
    )
    .await;

    let id = session_of(&outcome);
    let log = log_of(&server.api, &id).await;
    let rolled = of_kind(&log, "turn_rolled_back");
    assert_eq!(rolled.len(), 1, "{log:#?}");
    let first_turn = of_kind(&log, "turn_started")[0]["msg"]["turn_id"].clone();
    assert_eq!(rolled[0]["msg"]["rolled_back_turn_id"], first_turn);
    assert_eq!(user_texts(&log), [question, question], "the message was answered again");
    assert_eq!(answer_texts(&log), [first, second]);
    assert_eq!(server.api.session(&id).await["turns_completed"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_edits_a_past_message_into_a_fork() {
    let Some((tools, _browser, scratch)) = browser_test("web_ui_edits_a_past_message_into_a_fork").await else {
        return;
    };
    // The scripted model counts each session's calls: the fork's first call
    // takes the first line.
    let answers = ["Paris.", "Berlin."];
    let model = answering(&scratch, "edit.jsonl", &answers);
    let server = serve(&scratch, &model, &[]);
    let edited = "And the capital of Italy?";
    let outcome = scenario(
        &tools,
        "edit_message",
        &server.api.base,
        json!({
            "first_question": "The capital of France?",
            "second_question": "And of Germany?",
            "edited": edited,
            "answers": answers,
            "fork_answer": answers[0],
        }),
    )
    .await;

    // The fork starts where the edited message's turn began, without it.
    let (parent_log, fork_log) = fork_logs(&server.api, &outcome).await;
    assert_eq!(
        user_texts(&parent_log),
        ["The capital of France?", "And of Germany?"],
        "the parent is unchanged"
    );
    assert_eq!(user_texts(&fork_log), [edited]);
    assert_eq!(answer_texts(&fork_log), [answers[0]]);
    let session = server.api.session(&fork_of(&outcome)).await;
    assert_eq!(session["title"], edited, "the edited message titles the fork");
    assert_eq!(session["turns_completed"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_forks_from_a_message_and_links_back() {
    let Some((tools, _browser, scratch)) = browser_test("web_ui_forks_from_a_message_and_links_back").await else {
        return;
    };
    let answers = ["One.", "Two."];
    let model = answering(&scratch, "fork.jsonl", &answers);
    let server = serve(&scratch, &model, &[]);
    let questions = ["First?", "Second?"];
    let outcome = scenario(
        &tools,
        "fork_message",
        &server.api.base,
        json!({
            "questions": questions,
            "answers": answers,
            "fork_question": "Another second?",
            "fork_answer": answers[0],
        }),
    )
    .await;

    // Forked at the end of the first exchange, where the page said.
    let (parent_log, fork_log) = fork_logs(&server.api, &outcome).await;
    assert_eq!(user_texts(&parent_log), questions);
    assert_eq!(outcome.result["at_sequence"], json!(turn_ends(&parent_log)[0]));
    assert_eq!(user_texts(&fork_log), ["Another second?"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_titles_renames_and_deletes_a_session() {
    let Some((tools, _browser, scratch)) = browser_test("web_ui_titles_renames_and_deletes_a_session").await else {
        return;
    };
    let model = scratch.script("rename.jsonl", &[r#"{"text": "Gladly."}"#]);
    let server = serve(&scratch, &model, &[]);
    server.api.create(json!({"id": "keep-me"})).await;
    let outcome = scenario(
        &tools,
        "rename_delete",
        &server.api.base,
        json!({
            "first_message": "  Plan the trip\nwith the details",
            "auto_title": "Plan the trip",
            "answer": "Gladly.",
            "new_title": "Holiday plans",
            "other": "keep-me",
        }),
    )
    .await;

    let id = session_of(&outcome);
    let gone = server.api.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND, "{}", gone.body);
    let listed = server.api.get("/v1/sessions").await;
    let ids: Vec<&str> = listed.body["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|session| session["id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, ["keep-me"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_compacts_and_shows_refusals_and_failures_once() {
    let Some((tools, _browser, scratch)) = browser_test("web_ui_compacts_and_shows_refusals_and_failures_once").await
    else {
        return;
    };
    let summary = "The user said hello twice.";
    let model_error = "the scripted model is down";
    let model = scratch.script(
        "compact.jsonl",
        &[
            r#"{"text": "one"}"#,
            r#"{"text": "two"}"#,
            &json!({"text": summary, "summary": true}).to_string(),
            &json!({ "error": model_error }).to_string(),
            r#"{"text": "Back up."}"#,
        ],
    );
    let server = serve(&scratch, &model, &[]);
    let outcome = scenario(
        &tools,
        "compact",
        &server.api.base,
        json!({
            "answers": ["one", "two"],
            "summary": summary,
            "rejection": "there is no older history to compact",
            "model_error": model_error,
            "retried_answer": "Back up.",
        }),
    )
    .await;

    let id = session_of(&outcome);
    let log = log_of(&server.api, &id).await;
    let rejected = of_kind(&log, "submission_rejected");
    assert_eq!(rejected.len(), 1, "{log:#?}");
    let compacted = of_kind(&log, "context_compacted");
    assert_eq!(compacted.len(), 1, "{log:#?}");
    assert_eq!(compacted[0]["msg"]["reason"], "requested");
    assert_eq!(compacted[0]["msg"]["summary"], summary);
    assert_eq!(of_kind(&log, "error").len(), 1);
    let aborted = of_kind(&log, "turn_aborted");
    assert_eq!(aborted.len(), 1);
    let rolled = of_kind(&log, "turn_rolled_back");
    assert_eq!(rolled.len(), 1, "the failed turn was retried: {log:#?}");
    assert_eq!(rolled[0]["msg"]["rolled_back_turn_id"], aborted[0]["msg"]["turn_id"]);
    assert_eq!(answer_texts(&log), ["one", "two", "Back up."]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_runs_the_whole_flow_on_a_phone() {
    let Some((tools, _browser, scratch)) = browser_test("web_ui_runs_the_whole_flow_on_a_phone").await else {
        return;
    };
    let code = format!("let wide = \"{}\";", "x".repeat(120));
    let answers = [format!("First try:\n\n```\n{code}\n```"), "Second try.".to_owned()];
    // As the page shows the first answer: its code block has a Copy button.
    let first_shown = format!("First try:Copy{code}\n");
    let model = answering(&scratch, "phone.jsonl", &answers);
    let server = serve(&scratch, &model, &[]);
    let title = "A-title-with-nowhere-to-break-it-that-is-far-wider-than-any-phone-screen-is";
    let outcome = scenario(
        &tools,
        "phone",
        &server.api.base,
        json!({"question": "Hello from a phone", "answers": answers, "first_shown": first_shown, "title": title}),
    )
    .await;

    let parent = session_of(&outcome);
    let fork = fork_of(&outcome);
    let session = server.api.session(&parent).await;
    assert_eq!(session["title"], title);
    let log = log_of(&server.api, &parent).await;
    assert_eq!(of_kind(&log, "turn_rolled_back").len(), 1, "{log:#?}");
    assert_eq!(answer_texts(&log), answers);
    assert_eq!(of_kind(&log, "submission_rejected").len(), 1, "{log:#?}");
    let gone = server.api.get(&format!("/v1/sessions/{fork}")).await;
    assert_eq!(
        gone.status,
        StatusCode::NOT_FOUND,
        "the fork was deleted: {}",
        gone.body
    );
}
