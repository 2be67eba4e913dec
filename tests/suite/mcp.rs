//! MCP tool servers: the real `@modelcontextprotocol/server-everything` and
//! `server-filesystem` from npm (installed by `.ci/run` into
//! `.ci/node/node_modules`, or where `KEEL_MCP_NODE_MODULES` says) over
//! stdio and streamable HTTP, and a small scripted server (node, inline
//! below) for what real servers do not do on request: pages of tools,
//! garbage, crashes in the middle of a call, a silent or dying start.
//!
//! Outside CI, a test whose Node.js or npm packages are missing passes with
//! a `SKIPPED` line on the terminal; in CI (`CI` or `KEEL_REQUIRE_MCP_TESTS`
//! set, as `.ci/run` does) it fails instead.

use std::collections::BTreeMap;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use keel::agent::{AgentConfig, ModelEvent, ModelOutput, StreamingOptions, ToolCall};
use keel::config::KeelConfig;
use keel::protocol::*;
use keel::tools::mcp::{McpConfig, McpError, McpServer, McpServerConfig, McpTransport, start_servers};
use keel::tools::{ToolContext, ToolOutcome, ToolSet};
use keel::{CheckpointStore, Model};

use crate::suite::support::process::{marker, processes_with};
use crate::suite::support::server::free_port;
use crate::suite::support::skip;
use crate::suite::support::{agent::*, events::*, model::*, store::*, wait::*};

/// Where the npm packages are, installed or not.
fn node_modules_dir() -> PathBuf {
    std::env::var_os("KEEL_MCP_NODE_MODULES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/node/node_modules"))
}

/// Where the npm packages are; fails when they are missing (a test checks
/// [`mcp_skipped`] first).
pub(super) fn node_modules() -> PathBuf {
    let dir = node_modules_dir();
    let everything = dir.join("@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        everything.is_file(),
        "the MCP test servers are not installed in {}: run `npm ci --prefix .ci/node` (the install step of .ci/run), \
         or point KEEL_MCP_NODE_MODULES at a node_modules that has them",
        dir.display()
    );
    dir
}

/// Whether `test` is skipped because Node.js, or (with `packages`) the npm
/// test servers, are missing. Only outside CI (`CI` and
/// `KEEL_REQUIRE_MCP_TESTS` unset, see [`skip`]), and said on the
/// terminal; in CI a missing tool fails the test with how to install it.
pub(super) fn mcp_skipped(test: &str, packages: bool) -> bool {
    static NODE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let node = *NODE.get_or_init(|| {
        std::process::Command::new("node")
            .arg("--version")
            .output()
            .is_ok_and(|output| output.status.success())
    });
    let missing = if !node {
        "Node.js is not on PATH".to_owned()
    } else if packages
        && !node_modules_dir()
            .join("@modelcontextprotocol/server-everything/dist/index.js")
            .is_file()
    {
        format!(
            "the MCP test servers are not installed in {}",
            node_modules_dir().display()
        )
    } else {
        return false;
    };
    let how = "install Node.js and run `npm ci --prefix .ci/node` (the install step of .ci/run), or point \
               KEEL_MCP_NODE_MODULES at a node_modules that has them";
    assert!(
        skip::may_skip("KEEL_REQUIRE_MCP_TESTS"),
        "{missing}, and this run requires the MCP tests (CI or KEEL_REQUIRE_MCP_TESTS): {how}"
    );
    skip::announce(test, &format!("{missing}, so MCP is NOT tested here; {how}"));
    true
}

/// The everything server over stdio, tagged with `marker` (it ignores
/// arguments after the transport).
fn everything(marker: &str) -> McpServerConfig {
    let index = node_modules().join("@modelcontextprotocol/server-everything/dist/index.js");
    McpServerConfig::stdio("node", [index.display().to_string(), "stdio".into(), marker.to_owned()])
}

/// The filesystem server, allowed into `allowed` only.
pub(super) fn filesystem(allowed: &Path) -> McpServerConfig {
    let index = node_modules().join("@modelcontextprotocol/server-filesystem/dist/index.js");
    McpServerConfig::stdio("node", [index.display().to_string(), allowed.display().to_string()])
}

/// The scripted server, in `mode`, tagged with `marker`.
fn fake(mode: &str, marker: &str) -> McpServerConfig {
    McpServerConfig::stdio("node", ["-e", FAKE_SERVER, mode, marker])
}

async fn start(name: &str, config: &McpServerConfig) -> Arc<McpServer> {
    let workspace = std::env::temp_dir();
    guard("McpServer::start", McpServer::start(name, config, &workspace, None))
        .await
        .unwrap_or_else(|error| panic!("{error}"))
}

async fn start_error(name: &str, config: &McpServerConfig) -> McpError {
    let workspace = std::env::temp_dir();
    match guard("McpServer::start", McpServer::start(name, config, &workspace, None)).await {
        Ok(server) => panic!("{name} started: {server:?}"),
        Err(error) => error,
    }
}

fn tool_set(server: &Arc<McpServer>) -> ToolSet {
    let mut tools = ToolSet::new();
    for tool in server.tools() {
        tools.add(tool);
    }
    tools
}

fn context() -> ToolContext {
    ToolContext {
        session_id: "mcp-test".into(),
        workspace: std::env::temp_dir(),
    }
}

/// Runs `name` with `arguments` (JSON text) through the tool set.
async fn run(tools: &ToolSet, name: &str, arguments: &str) -> ToolOutcome {
    let call = ToolCall {
        call_id: "c1".into(),
        name: name.into(),
        arguments: arguments.into(),
    };
    guard(name, tools.run(&call, &context())).await
}

fn ok(output: &str) -> ToolOutcome {
    ToolOutcome {
        output: output.into(),
        is_error: false,
    }
}

/// A process, told apart from a later one with the same id by its start
/// time.
#[derive(Debug, Clone, Copy)]
struct Watched {
    pid: u32,
    started: u64,
}

/// The start time (clock ticks since boot) of `pid`, if it exists (a
/// zombie included).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, fields) = stat.rsplit_once(") ")?;
    fields.split_whitespace().nth(19)?.parse().ok()
}

fn watch(pid: u32) -> Watched {
    Watched {
        pid,
        started: start_time(pid).unwrap_or_else(|| panic!("process {pid} does not exist")),
    }
}

impl Watched {
    /// Whether the process still exists, running, dying or a zombie: it has
    /// not been reaped.
    fn lingers(self) -> bool {
        start_time(self.pid) == Some(self.started)
    }

    /// Waits until the process has exited and been reaped.
    async fn gone(self) {
        wait_until_async("the process is reaped", HANG_GUARD, async || !self.lingers()).await;
    }
}

fn kill(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {pid}");
}

#[tokio::test]
async fn everything_tools_are_offered_prefixed_by_the_server_name_with_their_schemas_and_hints() {
    if mcp_skipped(
        "everything_tools_are_offered_prefixed_by_the_server_name_with_their_schemas_and_hints",
        true,
    ) {
        return;
    }
    let marker = marker();
    let server = start("everything", &everything(&marker)).await;
    let tools = tool_set(&server);
    let names: Vec<String> = tools.specs().into_iter().map(|spec| spec.name).collect();
    for expected in [
        "everything__echo",
        "everything__get-sum",
        "everything__get-tiny-image",
        "everything__trigger-long-running-operation",
    ] {
        assert!(names.iter().any(|name| name == expected), "{expected} not in {names:?}");
    }
    assert!(names.iter().all(|name| name.starts_with("everything__")), "{names:?}");
    let echo = tools.get("everything__echo").expect("echo");
    let spec = echo.spec();
    assert_eq!(spec.description, "Echoes back the input string");
    assert_eq!(spec.parameters["type"], "object");
    assert_eq!(spec.parameters["properties"]["message"]["type"], "string");
    assert_eq!(spec.parameters["required"], serde_json::json!(["message"]));
    assert!(echo.read_only() && echo.parallel_safe(), "readOnlyHint: true");
    assert_eq!(server.starts(), 1);
    assert_eq!(processes_with(&marker), [server.process_id().expect("pid")]);
}

#[tokio::test]
async fn calls_return_the_servers_text_and_placeholders_for_other_content() {
    if mcp_skipped("calls_return_the_servers_text_and_placeholders_for_other_content", true) {
        return;
    }
    let server = start("everything", &everything(&marker())).await;
    let tools = tool_set(&server);
    assert_eq!(
        run(&tools, "everything__echo", r#"{"message": "hello"}"#).await,
        ok("Echo: hello")
    );
    assert_eq!(
        run(&tools, "everything__get-sum", r#"{"a": 2, "b": 3.5}"#).await,
        ok("The sum of 2 and 3.5 is 5.5.")
    );
    let image = run(&tools, "everything__get-tiny-image", "{}").await;
    assert!(!image.is_error, "{image:?}");
    let lines: Vec<&str> = image.output.lines().collect();
    assert_eq!(lines.len(), 3, "{image:?}");
    assert_eq!(lines[0], "Here's the image you requested:");
    assert!(
        lines[1].starts_with("[image: image/png, ") && lines[1].ends_with(" bytes]"),
        "{image:?}"
    );
    assert_eq!(lines[2], "The image above is the MCP logo.");
    // The schema is checked before the server is asked.
    let refused = run(&tools, "everything__echo", r#"{"message": 7}"#).await;
    assert!(
        refused.is_error && refused.output.starts_with("invalid arguments for 'everything__echo'"),
        "{refused:?}"
    );
}

#[tokio::test]
async fn a_server_gets_its_configured_variables_and_no_others_of_the_runtime() {
    if mcp_skipped(
        "a_server_gets_its_configured_variables_and_no_others_of_the_runtime",
        true,
    ) {
        return;
    }
    let mut config = everything(&marker());
    let McpTransport::Stdio { env, .. } = &mut config.transport else {
        unreachable!("stdio")
    };
    env.insert("KEEL_MCP_TEST_VALUE".into(), "configured".into());
    let server = start("everything", &config).await;
    let outcome = run(&tool_set(&server), "everything__get-env", "{}").await;
    assert!(!outcome.is_error, "{outcome:?}");
    let seen: BTreeMap<String, String> = serde_json::from_str(&outcome.output).expect("the environment as JSON");
    assert_eq!(seen["KEEL_MCP_TEST_VALUE"], "configured");
    let inherited = [
        "HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "TZ", "TMPDIR",
    ];
    for name in seen.keys() {
        assert!(
            name == "KEEL_MCP_TEST_VALUE" || inherited.contains(&name.as_str()),
            "{name} leaked into the server's environment"
        );
    }
}

#[tokio::test]
async fn a_tool_error_result_is_a_failed_call_and_the_server_goes_on() {
    if mcp_skipped("a_tool_error_result_is_a_failed_call_and_the_server_goes_on", true) {
        return;
    }
    let allowed = tempfile::tempdir().expect("allowed dir");
    let outside = tempfile::tempdir().expect("outside dir");
    let secret = outside.path().join("secret.txt");
    std::fs::write(&secret, "not for the model").expect("write");
    let server = start("files", &filesystem(allowed.path())).await;
    let tools = tool_set(&server);
    let denied = run(
        &tools,
        "files__read_text_file",
        &serde_json::json!({"path": secret}).to_string(),
    )
    .await;
    assert!(denied.is_error, "{denied:?}");
    assert!(
        denied
            .output
            .contains("Access denied - path outside allowed directories"),
        "{denied:?}"
    );
    assert!(!denied.output.contains("not for the model"));
    let inside = allowed.path().join("note.txt");
    let written = run(
        &tools,
        "files__write_file",
        &serde_json::json!({"path": inside, "content": "hello from keel"}).to_string(),
    )
    .await;
    assert!(!written.is_error, "{written:?}");
    assert_eq!(std::fs::read_to_string(&inside).expect("written"), "hello from keel");
    assert_eq!(
        run(
            &tools,
            "files__read_text_file",
            &serde_json::json!({"path": inside}).to_string()
        )
        .await,
        ok("hello from keel")
    );
    assert!(!tools.get("files__write_file").expect("write_file").read_only());
    assert!(tools.get("files__read_text_file").expect("read_text_file").read_only());
    assert_eq!(server.starts(), 1, "the error result did not restart the server");
}

#[tokio::test]
async fn a_call_past_its_timeout_fails_and_the_next_call_works() {
    if mcp_skipped("a_call_past_its_timeout_fails_and_the_next_call_works", true) {
        return;
    }
    let mut config = everything(&marker());
    // The thing under test: the operation takes minutes, the call may take 5 s.
    config.timeout = Duration::from_secs(5);
    let server = start("everything", &config).await;
    let tools = tool_set(&server);
    let slow = run(
        &tools,
        "everything__trigger-long-running-operation",
        r#"{"duration": 600, "steps": 1}"#,
    )
    .await;
    assert_eq!(
        slow,
        ToolOutcome::error(
            "the MCP server 'everything' did not answer the call to 'trigger-long-running-operation' within 5s"
        )
    );
    assert_eq!(
        run(&tools, "everything__echo", r#"{"message": "still here"}"#).await,
        ok("Echo: still here")
    );
    assert_eq!(server.starts(), 1);
}

#[tokio::test]
async fn a_killed_server_is_restarted_by_the_next_call_without_piling_up_processes() {
    if mcp_skipped(
        "a_killed_server_is_restarted_by_the_next_call_without_piling_up_processes",
        true,
    ) {
        return;
    }
    let marker = marker();
    let server = start("everything", &everything(&marker)).await;
    let tools = tool_set(&server);
    let first = server.process_id().expect("pid");
    assert_eq!(processes_with(&marker), [first]);
    for round in 1..=2 {
        let pid = server.process_id().expect("pid");
        let process = watch(pid);
        kill(pid);
        process.gone().await;
        assert_eq!(processes_with(&marker), Vec::<u32>::new());
        let message = format!("round {round}");
        assert_eq!(
            run(
                &tools,
                "everything__echo",
                &serde_json::json!({"message": message}).to_string()
            )
            .await,
            ok(&format!("Echo: {message}"))
        );
        let restarted = server.process_id().expect("pid");
        assert_ne!(restarted, pid);
        assert_eq!(processes_with(&marker), [restarted], "one live process per server");
        assert_eq!(server.starts(), 1 + round);
    }
}

#[tokio::test]
async fn a_server_that_dies_during_a_call_fails_that_call_and_is_restarted_by_the_next() {
    if mcp_skipped(
        "a_server_that_dies_during_a_call_fails_that_call_and_is_restarted_by_the_next",
        false,
    ) {
        return;
    }
    let marker = marker();
    let server = start("fake", &fake("basic", &marker)).await;
    let tools = tool_set(&server);
    let pid = server.process_id().expect("pid");
    let process = watch(pid);
    let died = run(&tools, "fake__exits", "{}").await;
    assert_eq!(
        died,
        ToolOutcome::error(
            "the MCP server 'fake' stopped: the process ended (exit status: 3); its stderr ended with: \
             fake server: exiting on purpose; it will be restarted on the next call"
        )
    );
    assert!(
        !process.lingers(),
        "the call's error comes after the process was reaped"
    );
    assert_eq!(run(&tools, "fake__ping", "{}").await, ok("pong {}"));
    assert_ne!(server.process_id(), Some(pid));
    assert_eq!(processes_with(&marker), [server.process_id().expect("pid")]);
    assert_eq!(server.starts(), 2);
}

#[tokio::test]
async fn dropping_the_tools_ends_the_server_process() {
    if mcp_skipped("dropping_the_tools_ends_the_server_process", true) {
        return;
    }
    let marker = marker();
    let server = start("everything", &everything(&marker)).await;
    let process = watch(server.process_id().expect("pid"));
    let tools = tool_set(&server);
    drop(server);
    assert!(process.lingers(), "the tools keep the server running");
    assert_eq!(
        run(&tools, "everything__echo", r#"{"message": "last"}"#).await,
        ok("Echo: last")
    );
    drop(tools);
    process.gone().await;
    assert_eq!(processes_with(&marker), Vec::<u32>::new());
}

#[tokio::test]
async fn shutting_a_server_down_ends_its_process_and_a_later_call_starts_it_again() {
    if mcp_skipped(
        "shutting_a_server_down_ends_its_process_and_a_later_call_starts_it_again",
        true,
    ) {
        return;
    }
    let marker = marker();
    let server = start("everything", &everything(&marker)).await;
    let process = watch(server.process_id().expect("pid"));
    guard("shutdown", server.shutdown()).await;
    assert!(!process.lingers(), "shutdown returns once the process is reaped");
    assert_eq!(processes_with(&marker), Vec::<u32>::new());
    let tools = tool_set(&server);
    assert_eq!(
        run(&tools, "everything__echo", r#"{"message": "back"}"#).await,
        ok("Echo: back")
    );
    assert_eq!(server.starts(), 2);
}

#[tokio::test]
async fn tool_lists_are_read_across_pages_and_names_and_schemas_made_fit_for_providers() {
    if mcp_skipped(
        "tool_lists_are_read_across_pages_and_names_and_schemas_made_fit_for_providers",
        false,
    ) {
        return;
    }
    let server = start("fake", &fake("basic", &marker())).await;
    let specs: BTreeMap<String, keel::agent::ToolSpec> = tool_set(&server)
        .specs()
        .into_iter()
        .map(|spec| (spec.name.clone(), spec))
        .collect();
    let names: Vec<&str> = specs.keys().map(String::as_str).collect();
    assert_eq!(names.len(), 8, "three pages of tools: {names:?}");
    for name in [
        "fake__ping",
        "fake__mixed",
        "fake__exits",
        "fake__garbage",
        "fake__fails",
        "fake__refused",
        "fake__empty",
    ] {
        assert!(specs.contains_key(name), "{name} not in {names:?}");
    }
    let long = names
        .iter()
        .find(|name| name.starts_with("fake__a_tool_with_a_name_far_too_long"))
        .expect("the long name, cleaned");
    assert_eq!(long.len(), 64, "{long}");
    assert!(
        long.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'),
        "{long}"
    );
    assert_eq!(specs["fake__ping"].description, "Answers pong.");
    assert_eq!(
        specs["fake__exits"].description,
        "The tool 'exits' of the MCP server 'fake'."
    );
    // A non-object schema is replaced; a bare object schema gets properties.
    assert_eq!(
        specs["fake__mixed"].parameters,
        serde_json::json!({"type": "object", "properties": {}})
    );
    assert_eq!(
        specs["fake__ping"].parameters,
        serde_json::json!({"type": "object", "properties": {}})
    );
}

#[tokio::test]
async fn unusual_results_and_garbage_become_text_or_clear_errors() {
    if mcp_skipped("unusual_results_and_garbage_become_text_or_clear_errors", false) {
        return;
    }
    let server = start("fake", &fake("basic", &marker())).await;
    let tools = tool_set(&server);
    // A line of garbage before the answer is skipped.
    assert_eq!(run(&tools, "fake__ping", r#"{"n": 1}"#).await, ok(r#"pong {"n":1}"#));
    assert_eq!(
        run(&tools, "fake__mixed", "{}").await,
        ok(
            "first\n[image: image/png, 5 bytes]\n[audio: audio/wav, 2 bytes]\n[resource: file:///notes.txt]\nnote text\n\
            [resource: file:///blob.bin, application/octet-stream, 6 bytes]\n[resource link: file:///linked.txt (linked.txt)]"
        )
    );
    assert_eq!(run(&tools, "fake__fails", "{}").await, ToolOutcome::error("it broke"));
    assert_eq!(
        run(&tools, "fake__refused", "{}").await,
        ToolOutcome::error("the MCP server 'fake' refused the call to 'refused': -32602: bad arguments")
    );
    assert_eq!(
        run(&tools, "fake__garbage", "{}").await,
        ToolOutcome::error(
            "the MCP server 'fake' answered the call to 'garbage' with something that is not a tool result"
        )
    );
    assert_eq!(
        run(&tools, "fake__empty", "{}").await,
        ok("(the tool returned no content)")
    );
    assert_eq!(server.starts(), 1, "none of these stopped the server");
}

#[tokio::test]
async fn servers_that_cannot_start_fail_with_a_clear_error() {
    if mcp_skipped("servers_that_cannot_start_fail_with_a_clear_error", true) {
        return;
    }
    let missing = start_error("ghost", &McpServerConfig::stdio("keel-no-such-mcp-server", ["--stdio"])).await;
    assert!(matches!(missing, McpError::Start { .. }), "{missing:?}");
    let text = missing.to_string();
    assert!(
        text.starts_with("the MCP server 'ghost' failed to start: cannot run 'keel-no-such-mcp-server' (in "),
        "{text}"
    );
    assert!(text.ends_with("No such file or directory (os error 2)"), "{text}");

    let dies = start_error("fake", &fake("dies-at-start", &marker())).await.to_string();
    assert!(
        dies.starts_with("the MCP server 'fake' failed to start: the MCP handshake failed: "),
        "{dies}"
    );
    assert!(
        dies.ends_with(
            "; the process ended (exit status: 2); its stderr ended with: boom: the fake server has no config"
        ),
        "{dies}"
    );

    let marker = marker();
    let mut silent = fake("silent", &marker);
    // The thing under test: a server that never answers, against a 2 s limit.
    silent.startup_timeout = Duration::from_secs(2);
    let silent = start_error("fake", &silent).await.to_string();
    assert_eq!(
        silent,
        "the MCP server 'fake' failed to start: no answer to the MCP handshake within 2s; \
         its stderr ended with: fake server: not answering"
    );
    assert_eq!(
        processes_with(&marker),
        Vec::<u32>::new(),
        "a failed start leaves no process"
    );

    let port = free_port();
    let nobody = start_error("nobody", &McpServerConfig::http(format!("http://127.0.0.1:{port}/mcp")))
        .await
        .to_string();
    assert!(
        nobody.starts_with(&format!(
            "the MCP server 'nobody' failed to start: the MCP handshake with http://127.0.0.1:{port}/mcp failed: "
        )) && nobody.ends_with("Connection refused (os error 111)"),
        "{nobody}"
    );

    let named = start_error("two words", &everything("x")).await;
    assert_eq!(
        named,
        McpError::Config {
            server: "two words".into(),
            message: "the server name 'two words' must be 1 to 32 characters out of A-Z a-z 0-9 _ - \
                      (it prefixes the names of its tools)"
                .into(),
        }
    );
}

#[tokio::test]
async fn a_session_starts_the_enabled_servers_and_reports_the_ones_that_failed() {
    if mcp_skipped(
        "a_session_starts_the_enabled_servers_and_reports_the_ones_that_failed",
        true,
    ) {
        return;
    }
    let index = node_modules().join("@modelcontextprotocol/server-everything/dist/index.js");
    let text = format!(
        r#"
        [mcp.servers.everything]
        command = "node"
        args = [{index:?}, "stdio"]
        timeout_secs = 30

        [mcp.servers.broken]
        command = "keel-no-such-mcp-server"

        [mcp.servers.off]
        command = "keel-no-such-mcp-server"
        enabled = false
        "#,
        index = index.display().to_string()
    );
    let config: KeelConfig = toml::from_str(&text).expect("config");
    let workspace = tempfile::tempdir().expect("workspace");
    let started = guard("start_servers", start_servers(&config.mcp, workspace.path(), None)).await;
    let servers: Vec<&str> = started.servers().iter().map(|server| server.name()).collect();
    assert_eq!(servers, ["everything"]);
    let failed: Vec<&str> = started.failures().iter().map(McpError::server).collect();
    assert_eq!(failed, ["broken"]);
    let tools = started.tools();
    assert!(!tools.is_empty());
    assert!(tools.iter().all(|tool| tool.spec().name.starts_with("everything__")));
    let none = guard(
        "no servers",
        start_servers(&McpConfig::default(), workspace.path(), None),
    )
    .await;
    assert!(none.tools().is_empty() && none.failures().is_empty());
}

#[tokio::test]
async fn an_agent_turn_calls_an_mcp_tool_and_records_its_result() {
    if mcp_skipped("an_agent_turn_calls_an_mcp_tool_and_records_its_result", true) {
        return;
    }
    let db = TestDb::new();
    let store = db.open();
    let mut mcp = McpConfig::default();
    mcp.servers.insert("everything".into(), everything(&marker()));
    let started = guard("start_servers", start_servers(&mcp, db.workspace(), None)).await;
    assert!(started.failures().is_empty(), "{started:?}");
    let model = TestModel::new(|call| {
        Box::pin(async move {
            if call.call_index == 0 {
                return Ok(ModelOutput::default().with_tool_calls(vec![ToolCall {
                    call_id: "echo-1".into(),
                    name: "everything__echo".into(),
                    arguments: r#"{"message": "hi from keel"}"#.into(),
                }]));
            }
            (call.sink)(ModelEvent::TextDelta("The server said hi.".into()))?;
            Ok(ModelOutput::text("The server said hi."))
        })
    });
    let store_dyn: Arc<dyn CheckpointStore> = store.clone();
    let model_dyn: Arc<dyn Model> = model.clone();
    let mut config = AgentConfig::new("mcp-session", store_dyn, model_dyn);
    config.workspace = db.workspace().to_path_buf();
    config.streaming = StreamingOptions::per_delta();
    config.tools = ToolSet::builtin();
    for tool in started.tools() {
        config.tools.add(tool);
    }
    drop(started);
    let mut agent = start_with(config).await;
    agent
        .sender()
        .submit(user("say hi through the server"))
        .expect("submit");
    let events = read_turn(&mut agent).await;

    let started: Vec<(String, String, String)> = events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::ToolCallStarted(call) => Some((call.call_id.clone(), call.name.clone(), call.arguments.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        started,
        [(
            "echo-1".to_owned(),
            "everything__echo".to_owned(),
            r#"{"message": "hi from keel"}"#.to_owned()
        )]
    );
    let completed: Vec<(String, String, bool)> = events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::ToolCallCompleted(done) => Some((done.call_id.clone(), done.output.clone(), done.is_error)),
            _ => None,
        })
        .collect();
    assert_eq!(
        completed,
        [("echo-1".to_owned(), "Echo: hi from keel".to_owned(), false)]
    );
    assert_eq!(assistant_text(&events), "The server said hi.");
    assert!(matches!(
        events.last().map(|event| &event.msg),
        Some(EventMsg::TurnComplete(_))
    ));
    let seen = model.seen();
    assert!(
        seen[0].tools.iter().any(|tool| tool == "everything__echo"),
        "{:?}",
        seen[0].tools
    );
    assert!(
        seen[1].history.contains(&TranscriptItem::ToolResult {
            call_id: "echo-1".into(),
            output: "Echo: hi from keel".into(),
            is_error: false,
        }),
        "{:?}",
        seen[1].history
    );
    shutdown(agent).await;
}

/// The agent with `tools`, a scripted model running `calls` (one step
/// each, then a last answer) and the everything server's timeout; returns
/// the events of one turn and what the model was given at each step.
async fn agent_turn(db: &TestDb, tools: ToolSet, calls: Vec<ToolCall>) -> (Vec<RecordedEvent>, Vec<Vec<String>>) {
    let store = db.open();
    let calls = Arc::new(calls);
    let model = TestModel::new(move |call| {
        let calls = Arc::clone(&calls);
        Box::pin(async move {
            if let Some(next) = usize::try_from(call.call_index).ok().and_then(|index| calls.get(index)) {
                return Ok(ModelOutput::default().with_tool_calls(vec![next.clone()]));
            }
            (call.sink)(ModelEvent::TextDelta("done".into()))?;
            Ok(ModelOutput::text("done"))
        })
    });
    let store_dyn: Arc<dyn CheckpointStore> = store.clone();
    let model_dyn: Arc<dyn Model> = model.clone();
    let mut config = AgentConfig::new("mcp-notices", store_dyn, model_dyn);
    config.workspace = db.workspace().to_path_buf();
    config.streaming = StreamingOptions::per_delta();
    config.tools = tools;
    config.approvals = keel::tools::ApprovalRules::auto();
    let mut agent = start_with(config).await;
    agent.sender().submit(user("go")).expect("submit");
    let mut events = vec![next(&mut agent).await];
    events.extend(read_turn(&mut agent).await);
    shutdown(agent).await;
    let seen = model.seen().into_iter().map(|request| request.tools).collect();
    (events, seen)
}

/// The payloads of the events of `kind`, as JSON.
fn payloads(events: &[RecordedEvent], kind: &str) -> Vec<serde_json::Value> {
    events
        .iter()
        .filter(|event| event.msg.kind() == kind)
        .map(|event| serde_json::to_value(&event.msg).expect("serialize"))
        .collect()
}

/// A session's tools as `keel run` and `keel serve` assemble them, with
/// `server` as the MCP server `name` and no built-in tools.
async fn session_set(db: &TestDb, name: &str, server: McpServerConfig) -> ToolSet {
    let config: KeelConfig = toml::from_str("[tools]\nbuiltin = false\n").expect("config");
    let mut mcp = McpConfig::default();
    mcp.servers.insert(name.into(), server);
    let built = guard(
        "session_tools",
        keel::tools::session_tools(&config.tools, &mcp, db.workspace(), None),
    )
    .await;
    assert!(built.warnings.is_empty(), "{:?}", built.warnings);
    built.tools
}

#[tokio::test]
async fn progress_is_recorded_as_events_and_keeps_a_long_call_alive_past_its_timeout() {
    let db = TestDb::new();
    let mut server = everything(&marker());
    // The thing under test: the call takes 3 s, the timeout is 1 s, and the
    // server reports progress every half second.
    server.timeout = Duration::from_secs(1);
    let tools = session_set(&db, "everything", server).await;
    let call = ToolCall {
        call_id: "long-1".into(),
        name: "everything__trigger-long-running-operation".into(),
        arguments: r#"{"duration": 3, "steps": 6}"#.into(),
    };
    let (events, _) = agent_turn(&db, tools, vec![call]).await;
    assert_eq!(
        tool_results(&events),
        [(
            "long-1".to_owned(),
            "Long running operation completed. Duration: 3 seconds, Steps: 6.".to_owned(),
            false
        )],
        "{:?}",
        kinds(&events)
    );
    let progress = payloads(&events, "tool_call_progress");
    let steps: Vec<f64> = progress
        .iter()
        .map(|event| {
            assert_eq!(event["call_id"], "long-1", "{event}");
            assert_eq!(event["total"], 6.0, "{event}");
            event["progress"].as_f64().expect("progress")
        })
        .collect();
    assert_eq!(steps, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    // Each report lies between the call's start and its result.
    let kinds = kinds(&events);
    let first = kinds
        .iter()
        .position(|kind| *kind == "tool_call_progress")
        .expect("progress");
    let last = kinds
        .iter()
        .rposition(|kind| *kind == "tool_call_progress")
        .expect("progress");
    assert_eq!(kinds[first - 1], "tool_call_started", "{kinds:?}");
    assert_eq!(kinds[last + 1], "tool_call_completed", "{kinds:?}");
}

#[tokio::test]
async fn the_tool_list_is_recorded_at_start_and_a_changed_list_reaches_the_next_model_step() {
    let db = TestDb::new();
    let tools = session_set(&db, "fake", fake("dynamic", &marker())).await;
    let grow = ToolCall {
        call_id: "grow-1".into(),
        name: "fake__grow".into(),
        arguments: "{}".into(),
    };
    let grown = ToolCall {
        call_id: "grown-1".into(),
        name: "fake__grown".into(),
        arguments: "{}".into(),
    };
    let (events, seen) = agent_turn(&db, tools, vec![grow, grown]).await;

    let started = serde_json::to_value(&events[0].msg).expect("serialize");
    assert_eq!(started["type"], "session_started");
    let at_start = started["tools"].as_array().expect("the tools at start").clone();
    assert!(at_start.contains(&"fake__grow".into()), "{at_start:?}");
    assert!(!at_start.contains(&"fake__grown".into()), "{at_start:?}");
    assert!(!seen[0].contains(&"fake__grown".to_owned()), "{:?}", seen[0]);

    let changed = payloads(&events, "tools_changed");
    assert_eq!(changed.len(), 1, "{:?}", kinds(&events));
    assert_eq!(changed[0]["added"], serde_json::json!(["fake__grown"]));
    assert_eq!(changed[0]["removed"], serde_json::json!([]));
    let mut now = at_start.clone();
    now.push("fake__grown".into());
    now.sort_by(|a, b| a.as_str().cmp(&b.as_str()));
    assert_eq!(changed[0]["tools"], serde_json::Value::Array(now));
    // Recorded before the step that sees it, which can call the new tool.
    let kinds = kinds(&events);
    let at = kinds
        .iter()
        .position(|kind| *kind == "tools_changed")
        .expect("tools_changed");
    assert_eq!(kinds[at + 1], "model_step_started", "{kinds:?}");
    assert!(seen[1].contains(&"fake__grown".to_owned()), "{:?}", seen[1]);
    assert_eq!(
        tool_results(&events),
        [
            ("grow-1".to_owned(), "grew".to_owned(), false),
            ("grown-1".to_owned(), "grown here".to_owned(), false),
        ]
    );
}

#[tokio::test]
async fn an_abandoned_call_is_cancelled_on_the_server() {
    let marker = marker();
    let server = start("fake", &fake("dynamic", &marker)).await;
    let tools = tool_set(&server);
    // An interrupted turn drops its calls' futures; so does this.
    let abandoned = tokio::time::timeout(Duration::from_millis(300), run(&tools, "fake__hang", "{}")).await;
    assert!(abandoned.is_err(), "{abandoned:?}");
    let seen = std::env::temp_dir().join(format!("cancelled-{marker}"));
    wait_until_async("the server to see the cancellation", HANG_GUARD, async || seen.exists()).await;
    let _ = std::fs::remove_file(&seen);
    assert_eq!(run(&tools, "fake__chatty", "{}").await, ok("said things"));
    assert_eq!(server.starts(), 1);
}

#[tokio::test]
async fn a_flood_of_progress_is_coalesced_and_its_last_report_comes_before_the_result() {
    let db = TestDb::new();
    let tools = session_set(&db, "fake", fake("dynamic", &marker())).await;
    let flood = ToolCall {
        call_id: "flood-1".into(),
        name: "fake__flood".into(),
        arguments: "{}".into(),
    };
    let (events, _) = agent_turn(&db, tools, vec![flood]).await;
    assert_eq!(
        tool_results(&events),
        [("flood-1".to_owned(), "flooded".to_owned(), false)]
    );
    let progress = payloads(&events, "tool_call_progress");
    // 2000 reports in a few milliseconds: a handful of events.
    assert!(
        !progress.is_empty() && progress.len() <= 20,
        "{} events",
        progress.len()
    );
    let last = progress.last().expect("progress");
    assert_eq!(last["progress"], 2000.0, "{last}");
    assert_eq!(last["message"], "step 2000", "{last}");
    let kinds = kinds(&events);
    let at = kinds
        .iter()
        .rposition(|kind| *kind == "tool_call_progress")
        .expect("progress");
    assert_eq!(kinds[at + 1], "tool_call_completed", "{kinds:?}");
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("buffer").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn server_log_messages_are_logged_through_tracing_with_the_server_name() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    // This test's runtime has one thread: the client's tasks log here.
    let _default = tracing::subscriber::set_default(subscriber);
    let server = start("fake", &fake("dynamic", &marker())).await;
    let tools = tool_set(&server);
    assert_eq!(run(&tools, "fake__chatty", "{}").await, ok("said things"));
    let logged = wait_for_async("the log lines", HANG_GUARD, async || {
        let text = String::from_utf8_lossy(&captured.0.lock().expect("buffer")).into_owned();
        text.contains("cache").then_some(text)
    })
    .await;
    let warning = logged
        .lines()
        .find(|line| line.contains("MCP server log") && line.contains("the disk is almost full"))
        .unwrap_or_else(|| panic!("no warning in {logged}"));
    assert!(
        warning.contains("WARN") && warning.contains("server=fake") && warning.contains("disk"),
        "{warning}"
    );
    let info = logged
        .lines()
        .find(|line| line.contains("MCP server log") && line.contains(r#"{"cache":"warm"}"#))
        .unwrap_or_else(|| panic!("no info line in {logged}"));
    assert!(info.contains("INFO") && info.contains("server=fake"), "{info}");
}

/// The everything server over streamable HTTP on a free loopback port.
struct HttpEverything {
    port: u16,
    child: tokio::process::Child,
}

impl HttpEverything {
    async fn start(port: u16) -> Self {
        let index = node_modules().join("@modelcontextprotocol/server-everything/dist/index.js");
        let child = tokio::process::Command::new("node")
            .arg(index)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start the HTTP server");
        wait_until_async("the HTTP server to listen", HANG_GUARD, async || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        })
        .await;
        Self { port, child }
    }

    async fn stop(mut self) {
        self.child.kill().await.expect("stop the HTTP server");
    }
}

#[tokio::test]
async fn a_streamable_http_server_is_called_and_reconnected_after_it_restarts() {
    if mcp_skipped(
        "a_streamable_http_server_is_called_and_reconnected_after_it_restarts",
        true,
    ) {
        return;
    }
    let http = HttpEverything::start(free_port()).await;
    let port = http.port;
    let mut config = McpServerConfig::http(format!("http://127.0.0.1:{port}/mcp"));
    let McpTransport::Http { headers, .. } = &mut config.transport else {
        unreachable!("http")
    };
    headers.insert("X-Keel-Test".into(), "yes".into());
    let server = start("web", &config).await;
    assert_eq!(server.process_id(), None);
    let tools = tool_set(&server);
    assert_eq!(
        run(&tools, "web__echo", r#"{"message": "over http"}"#).await,
        ok("Echo: over http")
    );

    http.stop().await;
    let lost = run(&tools, "web__echo", r#"{"message": "nobody there"}"#).await;
    assert!(lost.is_error, "{lost:?}");
    // Said as "stopped: …" when the call found the transport broken, or
    // "could not be restarted: …" when the transport had closed before it.
    assert!(lost.output.starts_with("the MCP server 'web' "), "{lost:?}");

    let http = HttpEverything::start(port).await;
    assert_eq!(
        run(&tools, "web__echo", r#"{"message": "back again"}"#).await,
        ok("Echo: back again")
    );
    assert_eq!(server.starts(), 2);
    drop(tools);
    drop(server);
    http.stop().await;
}

/// A scripted MCP server (newline-delimited JSON-RPC on stdio). Modes:
/// `basic` answers; `silent` never answers the handshake; `dies-at-start`
/// exits at once. Its tools come in three pages.
const FAKE_SERVER: &str = r#"
const mode = process.argv[1];
const send = (message) => process.stdout.write(JSON.stringify(message) + "\n");
const reply = (id, result) => send({ jsonrpc: "2.0", id, result });
if (mode === "dies-at-start") {
  process.stderr.write("boom: the fake server has no config\n");
  process.exit(2);
}
const pages = [
  [{ name: "ping", description: "Answers pong.", inputSchema: { type: "object" }, annotations: { readOnlyHint: true } }],
  [{ name: "a tool.with a name far too long for any provider to accept as it is", inputSchema: { type: "object", properties: {} } }],
  ["mixed", "exits", "garbage", "fails", "refused", "empty"].map((name) => ({
    name,
    inputSchema: name === "mixed" ? { type: "string" } : { type: "object", properties: {} },
  })),
];
if (mode === "dynamic") {
  pages[2].push({ name: "grow", inputSchema: { type: "object", properties: {} } });
  pages[2].push({ name: "chatty", inputSchema: { type: "object", properties: {} } });
  pages[2].push({ name: "hang", inputSchema: { type: "object", properties: {} } });
  pages[2].push({ name: "flood", inputSchema: { type: "object", properties: {} } });
}
function call(id, name, args, token) {
  switch (name) {
    case "flood":
      for (let step = 1; step <= 2000; step++) {
        send({ jsonrpc: "2.0", method: "notifications/progress", params: { progressToken: token, progress: step, total: 2000, message: "step " + step } });
      }
      return reply(id, { content: [{ type: "text", text: "flooded" }] });
    case "grow":
      // A new tool, announced before the answer, as servers do.
      pages[2].push({ name: "grown", description: "Grew at run time.", inputSchema: { type: "object", properties: {} } });
      send({ jsonrpc: "2.0", method: "notifications/tools/list_changed" });
      return reply(id, { content: [{ type: "text", text: "grew" }] });
    case "grown":
      return reply(id, { content: [{ type: "text", text: "grown here" }] });
    case "hang":
      return;
    case "chatty":
      send({ jsonrpc: "2.0", method: "notifications/message", params: { level: "warning", logger: "disk", data: "the disk is almost full" } });
      send({ jsonrpc: "2.0", method: "notifications/message", params: { level: "info", data: { cache: "warm" } } });
      return reply(id, { content: [{ type: "text", text: "said things" }] });
    case "ping":
      process.stdout.write("garbage before the answer\n");
      return reply(id, { content: [{ type: "text", text: "pong " + JSON.stringify(args) }] });
    case "mixed":
      return reply(id, { content: [
        { type: "text", text: "first" },
        { type: "image", data: "aGVsbG8=", mimeType: "image/png" },
        { type: "audio", data: "aGk=", mimeType: "audio/wav" },
        { type: "resource", resource: { uri: "file:///notes.txt", mimeType: "text/plain", text: "note text" } },
        { type: "resource", resource: { uri: "file:///blob.bin", mimeType: "application/octet-stream", blob: "aGVsbG8h" } },
        { type: "resource_link", uri: "file:///linked.txt", name: "linked.txt" },
      ] });
    case "exits":
      process.stderr.write("fake server: exiting on purpose\n");
      return process.exit(3);
    case "garbage":
      return reply(id, { content: "not a list of blocks" });
    case "fails":
      return reply(id, { content: [{ type: "text", text: "it broke" }], isError: true });
    case "refused":
      return send({ jsonrpc: "2.0", id, error: { code: -32602, message: "bad arguments" } });
    case "empty":
      return reply(id, {});
  }
  send({ jsonrpc: "2.0", id, error: { code: -32602, message: "no tool " + name } });
}
function handle(message) {
  if (message.method === "notifications/cancelled") {
    // Seen by the test, in the server's directory.
    require("fs").writeFileSync("cancelled-" + process.argv[2], String(message.params.requestId));
  }
  if (message.id === undefined) return;
  const { id, method, params } = message;
  if (mode === "silent") {
    process.stdout.write("this is not JSON-RPC\n");
    process.stderr.write("fake server: not answering\n");
    return;
  }
  switch (method) {
    case "initialize":
      return reply(id, { protocolVersion: params.protocolVersion, capabilities: { tools: {} }, serverInfo: { name: "fake", version: "1.0.0" } });
    case "ping":
      return reply(id, {});
    case "tools/list": {
      const page = params && params.cursor ? Number(params.cursor) : 0;
      return reply(id, page + 1 < pages.length ? { tools: pages[page], nextCursor: String(page + 1) } : { tools: pages[page] });
    }
    case "tools/call":
      return call(id, params.name, params.arguments || {}, params._meta && params._meta.progressToken);
  }
  send({ jsonrpc: "2.0", id, error: { code: -32601, message: "no method " + method } });
}
let buffered = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => {
  buffered += chunk;
  let end;
  while ((end = buffered.indexOf("\n")) >= 0) {
    const line = buffered.slice(0, end);
    buffered = buffered.slice(end + 1);
    if (line.trim()) handle(JSON.parse(line));
  }
});
process.stdin.on("end", () => process.exit(0));
"#;
