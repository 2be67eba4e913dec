//! Traces, judged by Arize Phoenix (PyPI, pinned in `.ci/python`), a real
//! back end that reads the OpenTelemetry GenAI conventions, started on
//! loopback: `keel serve` exports to it over OTLP/HTTP, and the spans read
//! back from its REST API are checked against the session's log and
//! `GET /v1/usage`, across a `kill -9` during an approval wait and one
//! that cuts a turn short.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use keel::protocol::{EventMsg, RecordedEvent};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::suite::support::api::Resume;
use crate::suite::support::http_server::{Reply, ScriptedServer};
use crate::suite::support::python::venv_python;
use crate::suite::support::server::{Scratch, ServeProcess, free_port, slow_chunks};
use crate::suite::support::wait::{HANG_GUARD, poll_for_async, wait_for_async};

/// The trace and span of the caller that submits the first message.
const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// Phoenix as a process, with its data in a directory of its own.
struct Phoenix {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Phoenix {
    /// Starts `phoenix serve` from the environment of `python`, offline,
    /// on a loopback port it picks, and waits until it answers.
    async fn start(python: &Path) -> Self {
        let dir = tempfile::tempdir().expect("a directory for Phoenix");
        let log = dir.path().join("phoenix.log");
        let phoenix = python.with_file_name("phoenix");
        let child = Command::new(&phoenix)
            .arg("serve")
            .env("PHOENIX_WORKING_DIR", dir.path())
            .env("TMPDIR", dir.path())
            .env("PHOENIX_HOST", "127.0.0.1")
            .env("PHOENIX_PORT", "0")
            .env("PHOENIX_GRPC_PORT", "0")
            .env("PHOENIX_TELEMETRY_ENABLED", "false")
            .env("PHOENIX_ALLOW_EXTERNAL_RESOURCES", "false")
            .env("PHOENIX_DISABLE_AGENT_ASSISTANT", "true")
            .env("PHOENIX_AGENTS_DISABLE_BASH", "true")
            .env("PHOENIX_ALLOWED_SANDBOX_PROVIDERS", "NONE")
            .env("PHOENIX_ENABLE_AUTH", "false")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).expect("Phoenix's log"))
            .stderr(Stdio::from(
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(&log)
                    .expect("Phoenix's log"),
            ))
            .spawn()
            .unwrap_or_else(|error| panic!("start {}: {error}", phoenix.display()));
        let port = wait_for_async("Phoenix to listen", Duration::from_secs(120), async || {
            let mut text = String::new();
            std::fs::File::open(&log).ok()?.read_to_string(&mut text).ok()?;
            let (_, rest) = text.split_once("Uvicorn running on http://127.0.0.1:")?;
            rest.split(|c: char| !c.is_ascii_digit()).next()?.parse::<u16>().ok()
        })
        .await;
        let base = format!("http://127.0.0.1:{port}");
        wait_for_async("Phoenix to answer", Duration::from_secs(60), async || {
            reqwest::get(format!("{base}/healthz"))
                .await
                .ok()
                .filter(|reply| reply.status().is_success())
        })
        .await;
        Self { child, base, _dir: dir }
    }

    /// Every span of the default project.
    async fn spans(&self) -> Vec<Value> {
        let mut spans = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut url = format!("{}/v1/projects/default/spans?limit=1000", self.base);
            if let Some(cursor) = &cursor {
                url.push_str(&format!("&cursor={cursor}"));
            }
            let Ok(reply) = reqwest::get(&url).await else {
                return spans;
            };
            if reply.status() == StatusCode::NOT_FOUND {
                return spans;
            }
            let page: Value = reply.json().await.expect("spans as JSON");
            spans.extend(page["data"].as_array().cloned().unwrap_or_default());
            match page["next_cursor"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => return spans,
            }
        }
    }

    /// Waits until the spans satisfy `done`, and returns them.
    async fn wait_for_spans(&self, what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let found = poll_for_async(HANG_GUARD, async || {
            let spans = self.spans().await;
            done(&spans).then_some(spans)
        })
        .await;
        found.unwrap_or_else(|| {
            panic!(
                "timed out waiting for {what}; Phoenix has: {:#?}",
                summary(&futures::executor::block_on(self.spans()))
            )
        })
    }
}

impl Drop for Phoenix {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Each span's name, ids, status and the attributes the test reads.
fn summary(spans: &[Value]) -> Vec<String> {
    spans
        .iter()
        .map(|span| {
            format!(
                "{} trace={} span={} parent={} status={} turn={} error={} call={}",
                span["name"],
                span["context"]["trace_id"],
                span["context"]["span_id"],
                span["parent_id"],
                span["status_code"],
                span["attributes"]["keel.turn.id"],
                span["attributes"]["error.type"],
                span["attributes"]["gen_ai.tool.call.id"],
            )
        })
        .collect()
}

fn named<'a>(spans: &'a [Value], prefix: &str) -> Vec<&'a Value> {
    spans
        .iter()
        .filter(|span| span["name"].as_str().is_some_and(|name| name.starts_with(prefix)))
        .collect()
}

fn attribute<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

/// `keel serve` on `port`, exporting as `keel.toml` says, logging at
/// `info`.
fn serve(scratch: &Scratch, port: u16) -> ServeProcess {
    let listen = format!("127.0.0.1:{port}");
    let mut command = ServeProcess::command(scratch, &["--listen", &listen, "--config", "keel.toml"]);
    command.env("KEEL_LOG", "info");
    ServeProcess::spawn(command)
}

/// Phoenix started, and a scratch directory whose `keel.toml` exports to
/// it: `before` (other tables) first, then `[telemetry]` with `telemetry`
/// added. `None` (the test is skipped) without the Python environment.
async fn exporting_to_phoenix(test: &str, before: &str, telemetry: &str) -> Option<(Phoenix, Scratch)> {
    let python = venv_python(test)?;
    let phoenix = Phoenix::start(&python).await;
    let scratch = Scratch::new();
    std::fs::write(
        scratch.dir.path().join("keel.toml"),
        format!("{before}[telemetry]\nendpoint = \"{}\"\n{telemetry}", phoenix.base),
    )
    .expect("keel.toml");
    Some((phoenix, scratch))
}

async fn log_of(server: &ServeProcess, session: &str) -> Vec<RecordedEvent> {
    let reply = server
        .api
        .get(&format!("/v1/sessions/{session}/events?limit=1000"))
        .await;
    serde_json::from_value(reply.body["events"].clone()).expect("events")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn phoenix_holds_a_span_per_turn_step_and_tool_call_across_kill_9() {
    let Some((phoenix, scratch)) =
        exporting_to_phoenix("suite::server::traces (Phoenix)", "", "service_name = \"keel-test\"\n").await
    else {
        return;
    };
    let usage =
        |input: u64, output: u64| json!({"input_tokens": input, "cached_input_tokens": 2, "output_tokens": output});
    let lines = [
        json!({"text": "One.", "usage": usage(11, 3)}),
        json!({"tool_calls": [{"id": "clock-1", "name": "clock", "arguments": {}}], "usage": usage(13, 4)}),
        json!({"text": "It is now.", "usage": usage(17, 5)}),
        json!({"tool_calls": [{"id": "write-1", "name": "write_file", "arguments": {"path": "a.txt", "content": "x"}}],
               "usage": usage(19, 6)}),
        json!({"text": "Written.", "usage": usage(23, 7)}),
        serde_json::from_str::<Value>(&slow_chunks(400, 50)).expect("a slow line"),
        json!({"summary": true, "text": "They talked about the time.", "usage": usage(29, 8)}),
    ];
    let model = scratch.script_of("traced.jsonl", &lines);
    let port = free_port();
    let mut server = serve(&scratch, port);
    let mut earlier_logs = Vec::new();
    server
        .api
        .create(json!({"id": "traced", "model": model, "tools": {"shell": false},
            "approvals": {"default": "ask", "tools": {"clock": "auto"}}}))
        .await;
    // A plain turn, in the caller's trace (W3C `traceparent`), and one with
    // a tool call.
    let request = server
        .api
        .client
        .post(server.api.url("/v1/sessions/traced/submissions"))
        .header("traceparent", format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"))
        .json(&json!({"op": {"type": "user_input", "text": "one"}}));
    let traced = server.api.send(request).await;
    assert_eq!(traced.status, StatusCode::ACCEPTED, "{}", traced.body);
    server.api.wait_idle("traced").await;
    // A log line written inside that turn carries its trace.
    let logged = server.logged();
    assert!(
        logged.iter().any(
            |line| line.contains("project instructions read") && line.contains(&format!("trace_id={CALLER_TRACE}"))
        ),
        "{logged:#?}"
    );
    server.api.say("traced", "what time is it").await;
    server.api.wait_idle("traced").await;
    // A summary asked for between turns: a model span of its own.
    let compact = server.api.submit("traced", json!({"op": {"type": "compact"}})).await;
    assert_eq!(compact.status, StatusCode::ACCEPTED, "{}", compact.body);
    server.api.wait_idle("traced").await;
    phoenix
        .wait_for_spans("the first two turns' spans", |spans| {
            named(spans, "invoke_agent").len() >= 2
        })
        .await;
    // A turn waiting for approval across a kill -9: the new process
    // finishes it and reports its span under the ids it started with.
    let mut stream = server.api.stream("traced", Resume::Start).await;
    server.api.say("traced", "write it").await;
    stream.until(|event| event.msg.kind() == "approval_requested").await;
    drop(stream);
    tokio::time::sleep(Duration::from_millis(800)).await;
    earlier_logs.extend(server.logged());
    tokio::task::spawn_blocking(move || server.crash())
        .await
        .expect("kill -9");
    server = serve(&scratch, port);
    let approved = server
        .api
        .submit(
            "traced",
            json!({"op": {"type": "approval", "call_id": "write-1", "decision": "approve"}}),
        )
        .await;
    assert_eq!(approved.status, StatusCode::ACCEPTED, "{}", approved.body);
    server.api.wait_idle("traced").await;
    // Spans wait up to a quarter of a second to be exported: those of a
    // process killed meanwhile are lost, so the next kill waits for them.
    phoenix
        .wait_for_spans("the approved turn's spans", |spans| {
            named(spans, "invoke_agent").len() >= 3 && named(spans, "execute_tool").len() >= 2
        })
        .await;
    // A turn cut by a kill -9 mid-stream: closed as `runtime_stopped` when
    // the session is opened again, and its span with it.
    let mut stream = server.api.stream("traced", Resume::Start).await;
    let asked = server.api.say("traced", "a long answer").await;
    let asked_at = asked["sequence"].as_u64().expect("the submission's sequence");
    // A delta of this turn: the stream replays the earlier turns' first.
    stream
        .until(|event| event.sequence > asked_at && event.msg.kind() == "assistant_content_delta")
        .await;
    drop(stream);
    earlier_logs.extend(server.logged());
    tokio::task::spawn_blocking(move || server.crash())
        .await
        .expect("kill -9");
    let server = serve(&scratch, port);
    server.api.session("traced").await;
    let reopened = server
        .api
        .post("/v1/sessions/traced/submissions", &json!({"op": {"type": "interrupt"}}))
        .await;
    assert!(
        reopened.status.is_success() || reopened.status.is_client_error(),
        "{}",
        reopened.body
    );
    server.api.wait_idle("traced").await;

    let log = log_of(&server, "traced").await;
    let turns: BTreeMap<String, String> = log
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::TurnStarted(started) => Some((
                started.turn_id.clone(),
                started.trace_id.clone().expect("every turn_started records its trace"),
            )),
            _ => None,
        })
        .collect();
    assert_eq!(turns.len(), 4, "{log:#?}");
    let tool_calls: Vec<String> = log
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::ToolCallStarted(started) => Some(started.call_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(tool_calls, ["clock-1", "write-1"]);
    let spans = phoenix
        .wait_for_spans("a span per turn and per tool call", |spans| {
            named(spans, "invoke_agent").len() >= turns.len() && named(spans, "execute_tool").len() >= tool_calls.len()
        })
        .await;

    // One turn span per turn, in the turn's trace, with the session.
    let turn_spans = named(&spans, "invoke_agent");
    assert_eq!(turn_spans.len(), turns.len(), "{turn_spans:#?}");
    let mut span_of_turn = BTreeMap::new();
    for span in &turn_spans {
        let turn_id = attribute(span, "keel.turn.id")
            .as_str()
            .expect("keel.turn.id")
            .to_owned();
        assert_eq!(span["context"]["trace_id"], turns[&turn_id].as_str(), "{span:#}");
        assert_eq!(attribute(span, "gen_ai.conversation.id"), "traced");
        assert_eq!(attribute(span, "gen_ai.operation.name"), "invoke_agent");
        span_of_turn.insert(turn_id, (*span).clone());
    }
    // The turn submitted with a `traceparent` is in the caller's trace,
    // under the caller's span.
    let first_turn = log
        .iter()
        .find_map(|event| match &event.msg {
            EventMsg::TurnStarted(started) => Some(started.turn_id.clone()),
            _ => None,
        })
        .expect("a first turn");
    assert_eq!(turns[&first_turn], CALLER_TRACE);
    assert_eq!(
        span_of_turn[&first_turn]["parent_id"], CALLER_SPAN,
        "{:#}",
        span_of_turn[&first_turn]
    );
    assert_eq!(span_of_turn[&first_turn]["context"]["trace_id"], CALLER_TRACE);
    // The cut turn's span ended in error, after the restart.
    let cut: Vec<&Value> = turn_spans
        .iter()
        .copied()
        .filter(|span| attribute(span, "error.type") == "runtime_stopped")
        .collect();
    assert_eq!(cut.len(), 1, "{turn_spans:#?}");
    assert_eq!(cut[0]["status_code"], "ERROR", "{:#}", cut[0]);
    // Model spans under their turns, whose tokens add up to the usage.
    let chat_spans = named(&spans, "chat ");
    assert_eq!(chat_spans.len(), 6, "{chat_spans:#?}");
    let summaries: Vec<&&Value> = chat_spans
        .iter()
        .filter(|span| attribute(span, "keel.compaction") == "summary")
        .collect();
    assert_eq!(summaries.len(), 1, "{chat_spans:#?}");
    assert_eq!(attribute(summaries[0], "gen_ai.usage.input_tokens"), 29);
    let parents: Vec<&str> = turn_spans
        .iter()
        .filter_map(|span| span["context"]["span_id"].as_str())
        .collect();
    // The summary between turns has a trace of its own; the steps are
    // under their turns.
    for span in chat_spans
        .iter()
        .filter(|span| attribute(span, "keel.compaction").is_null())
    {
        assert!(
            parents.contains(&span["parent_id"].as_str().unwrap_or_default()),
            "{span:#}"
        );
        assert_eq!(attribute(span, "gen_ai.operation.name"), "chat");
    }
    let sum = |key: &str| -> u64 {
        chat_spans
            .iter()
            .map(|span| attribute(span, key).as_u64().unwrap_or(0))
            .sum()
    };
    let usage = server.api.get("/v1/usage").await;
    assert_eq!(usage.status, StatusCode::OK, "{}", usage.body);
    assert_eq!(
        sum("gen_ai.usage.input_tokens"),
        usage.body["total"]["input_tokens"].as_u64().expect("input")
    );
    assert_eq!(
        sum("gen_ai.usage.output_tokens"),
        usage.body["total"]["output_tokens"].as_u64().expect("output")
    );
    assert_eq!(
        sum("gen_ai.usage.cache_read.input_tokens"),
        usage.body["total"]["cached_input_tokens"].as_u64().expect("cached")
    );
    // One tool span per started call, under its turn; the approved one
    // says when the approval was asked for.
    let tool_spans = named(&spans, "execute_tool");
    let ids: Vec<&str> = tool_spans
        .iter()
        .filter_map(|span| attribute(span, "gen_ai.tool.call.id").as_str())
        .collect();
    assert_eq!(ids.len(), tool_calls.len(), "{tool_spans:#?}");
    for call in &tool_calls {
        assert!(ids.contains(&call.as_str()), "{call}: {tool_spans:#?}");
    }
    for span in &tool_spans {
        assert!(
            parents.contains(&span["parent_id"].as_str().unwrap_or_default()),
            "{span:#}"
        );
    }
    // What was said stays out of the spans unless the operator turns
    // `capture_content` on.
    for span in &spans {
        for key in [
            "gen_ai.output.messages",
            "gen_ai.tool.call.arguments",
            "gen_ai.tool.call.result",
        ] {
            assert!(attribute(span, key).is_null(), "{key} in {span:#}");
        }
    }
    let (status, stderr) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .expect("terminate");
    assert!(status.success(), "{status}");
    // No process complained about exporting (the killed ones included).
    let complaints: Vec<&String> = earlier_logs
        .iter()
        .chain(&stderr)
        .filter(|line| line.contains("export") || line.contains("opentelemetry"))
        .collect();
    assert!(complaints.is_empty(), "the exporter complained: {complaints:#?}");
}

/// With `capture_content` on, spans carry what was said (the model's
/// output, a tool's arguments and result), redacted as the log is. A shell
/// call's span names the sandbox it ran in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captured_content_is_redacted_as_the_log_is() {
    let Some((phoenix, scratch)) = exporting_to_phoenix(
        "suite::server::traces (content)",
        "[server]\nauto_approve = [\"write_file\", \"shell\"]\n\n",
        "capture_content = true\n",
    )
    .await
    else {
        return;
    };
    let leaked = "Authorization: Bearer tok-0123456789abcdef0123";
    let lines = [
        json!({"tool_calls": [{"id": "w-1", "name": "write_file",
            "arguments": {"path": "note.txt", "content": leaked}}]}),
        json!({"tool_calls": [{"id": "s-1", "name": "shell", "arguments": {"command": "cat note.txt"}}]}),
        json!({"text": format!("Saved. {leaked}")}),
    ];
    let model = scratch.script_of("content.jsonl", &lines);
    let server = serve(&scratch, free_port());
    server
        .api
        .create(
            json!({"id": "said", "model": model, "tools": {"sandbox": "workspace-write"},
            "approvals": {"tools": {"write_file": "auto", "shell": "auto"}}}),
        )
        .await;
    server.api.say("said", "save it").await;
    server.api.wait_idle("said").await;
    let spans = phoenix
        .wait_for_spans("the turn's spans", |spans| {
            named(spans, "invoke_agent").len() == 1 && named(spans, "chat ").len() == 3
        })
        .await;
    let shell = named(&spans, "execute_tool shell");
    assert_eq!(shell.len(), 1, "{spans:#?}");
    assert_eq!(
        attribute(shell[0], "keel.sandbox.policy"),
        "workspace-write",
        "{:#}",
        shell[0]
    );
    let tool = named(&spans, "execute_tool write_file");
    assert_eq!(tool.len(), 1, "{spans:#?}");
    let arguments = attribute(tool[0], "gen_ai.tool.call.arguments")
        .as_str()
        .expect("arguments");
    assert!(
        arguments.contains("note.txt") && arguments.contains("[redacted]"),
        "{arguments}"
    );
    assert!(
        attribute(tool[0], "gen_ai.tool.call.result").is_string(),
        "{:#}",
        tool[0]
    );
    let outputs: Vec<&str> = named(&spans, "chat ")
        .iter()
        .filter_map(|span| attribute(span, "gen_ai.output.messages").as_str())
        .collect();
    assert!(
        outputs
            .iter()
            .any(|output| output.contains("Saved.") && output.contains("[redacted]")),
        "{outputs:?}"
    );
    let everything = serde_json::to_string(&spans).expect("JSON");
    assert!(
        !everything.contains("tok-0123456789abcdef0123"),
        "the credential reached the spans"
    );
}

/// A model step's span names what the provider said of its answer (its
/// id, the dated model that answered) and what was asked (the model, the
/// output limit and temperature sent), from a Chat Completions stream
/// captured from OpenAI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steps_span_names_the_providers_response_and_the_requests_parameters() {
    let upstream = ScriptedServer::start(vec![Reply::sse_in_pieces(
        include_bytes!("../../fixtures/openai-chat/openai-text-usage.sse"),
        64,
    )])
    .await;
    let model = format!(
        "[models.gpt]\nprovider = \"openai\"\nmodel = \"gpt-4.1-mini\"\nbase_url = \"{}/v1\"\n\
         api_key_env = \"KEEL_TEST_GPT_KEY\"\nmax_retries = 0\nmax_output_tokens = 256\ntemperature = 0.25\n\n",
        upstream.url()
    );
    let Some((phoenix, scratch)) = exporting_to_phoenix("suite::server::traces (provider)", &model, "").await else {
        return;
    };
    let listen = format!("127.0.0.1:{}", free_port());
    let mut command = ServeProcess::command(
        &scratch,
        &["--listen", &listen, "--config", "keel.toml", "--model", "gpt"],
    );
    command.env("KEEL_TEST_GPT_KEY", "sk-keel-test");
    let server = ServeProcess::spawn(command);
    server.api.create(json!({"id": "asked"})).await;
    server.api.say("asked", "hello").await;
    server.api.wait_idle("asked").await;
    let spans = phoenix
        .wait_for_spans("the step's span", |spans| named(spans, "chat ").len() == 1)
        .await;
    let chat = named(&spans, "chat ")[0];
    let expected = [
        ("gen_ai.provider.name", json!("openai")),
        ("gen_ai.request.model", json!("gpt-4.1-mini")),
        ("gen_ai.response.model", json!("gpt-4.1-mini-2025-04-14")),
        ("gen_ai.response.id", json!("chatcmpl-Uq5sR8cVrT3nOx9LyM4bA0wZe2Fg")),
        ("gen_ai.request.max_tokens", json!(256)),
        ("gen_ai.request.temperature", json!(0.25)),
        ("gen_ai.usage.input_tokens", json!(1200)),
        ("gen_ai.usage.output_tokens", json!(80)),
        ("server.address", json!("127.0.0.1")),
    ];
    for (key, value) in expected {
        assert_eq!(attribute(chat, key), &value, "{key} of {chat:#}");
    }
    assert_eq!(upstream.requests()[0].json()["max_tokens"], json!(256));
}

/// A `traceparent` on each route that starts a turn (a submission, an AI
/// SDK chat message, an AG-UI run) puts the turn in the caller's trace:
/// its `turn_started` names the caller's trace id. A turn asked for
/// without one gets a trace of its own. Tracing need not be exported for
/// the log to say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traceparent_on_every_route_that_starts_a_turn_puts_the_turn_in_the_callers_trace() {
    let scratch = Scratch::new();
    let model = scratch.script_of("hi.jsonl", &[json!({"text": "Hi."})]);
    let server = ServeProcess::start(&scratch, &["--model", &model]);
    server.api.create(json!({"id": "native"})).await;
    server.api.create(json!({"id": "untraced"})).await;
    let user = |text: &str| json!([{"id": "m1", "role": "user", "parts": [{"type": "text", "text": text}]}]);
    let routes = [
        (
            "native",
            "/v1/sessions/native/submissions",
            json!({"op": {"type": "user_input", "text": "hi"}}),
        ),
        (
            "sdk",
            "/v1/ai-sdk/chat",
            json!({"id": "sdk", "trigger": "submit-message", "messages": user("hi")}),
        ),
        (
            "agui",
            "/v1/ag-ui",
            json!({"threadId": "agui", "runId": "r1", "state": {}, "tools": [], "context": [],
                   "forwardedProps": {}, "messages": [{"id": "m1", "role": "user", "content": "hi"}]}),
        ),
    ];
    let mut traces = BTreeMap::new();
    for (index, (session, path, body)) in routes.iter().enumerate() {
        let trace = format!(
            "{:032x}",
            0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4700_u128 + index as u128
        );
        let request = server
            .api
            .client
            .post(server.api.url(path))
            .header("traceparent", format!("00-{trace}-00f067aa0ba902b7-01"))
            .json(body);
        let reply = server.api.send(request).await;
        assert!(reply.status.is_success(), "{path}: {} {}", reply.status, reply.body);
        server.api.wait_idle(session).await;
        traces.insert(*session, trace);
    }
    server.api.say("untraced", "hi").await;
    server.api.wait_idle("untraced").await;
    let trace_of = async |session: &str| -> String {
        let started: Vec<String> = log_of(&server, session)
            .await
            .into_iter()
            .filter_map(|event| match event.event.msg {
                EventMsg::TurnStarted(started) => started.trace_id,
                _ => None,
            })
            .collect();
        assert_eq!(started.len(), 1, "{session}: {started:?}");
        started[0].clone()
    };
    for (session, trace) in &traces {
        assert_eq!(&trace_of(session).await, trace, "{session}");
    }
    let own = trace_of("untraced").await;
    assert!(own.len() == 32 && !traces.values().any(|trace| *trace == own), "{own}");
}
