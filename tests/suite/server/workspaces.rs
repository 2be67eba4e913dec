//! What a session id may name under the workspace root, over real HTTP: a
//! session works only in a directory Keel created for it (never an existing
//! directory of the operator's, never a link), its file tools refuse a
//! workspace swapped for a link or another directory, and a delete removes
//! only what Keel created, never Keel's own files.

use std::path::{Path, PathBuf};
use std::process::Command;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::suite::support::api::Api;
use crate::suite::support::server::{Scratch, ServeProcess, TestServer};

/// A script of one step making `calls`, then answering `done`.
fn calls_script(scratch: &Scratch, name: &str, calls: &[Value]) -> String {
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(index, call)| json!({"id": format!("call-{index}"), "name": call["name"], "arguments": call["arguments"]}))
        .collect();
    scratch.script(
        name,
        &[&json!({"tool_calls": calls}).to_string(), r#"{"text": "done"}"#],
    )
}

fn call(name: &str, arguments: Value) -> Value {
    json!({"name": name, "arguments": arguments})
}

/// A server whose clients may auto-approve every tool.
async fn permissive_server() -> TestServer {
    TestServer::start(|config, scratch| {
        config.keel.server.auto_approve = vec!["*".to_owned()];
        // The front-end protocols' first use makes a session under the
        // server's defaults.
        config.default_model = Some(scratch.script("default.jsonl", &[r#"{"text": "Hi."}"#]));
    })
    .await
}

/// The tool results (output, is error) of the session's log, once idle.
async fn tool_results(api: &Api, session_id: &str) -> Vec<(String, bool)> {
    api.wait_idle(session_id).await;
    let events = api.get(&format!("/v1/sessions/{session_id}/events?limit=1000")).await;
    events.body["events"]
        .as_array()
        .map(|events| {
            events
                .iter()
                .filter(|event| event["msg"]["type"] == "tool_call_completed")
                .map(|event| {
                    (
                        event["msg"]["output"].as_str().unwrap_or_default().to_owned(),
                        event["msg"]["is_error"] == true,
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

async fn delete(api: &Api, session_id: &str, workspace: bool) -> crate::suite::support::api::Reply {
    let query = if workspace { "?workspace=true" } else { "" };
    api.send(api.client.delete(api.url(&format!("/v1/sessions/{session_id}{query}"))))
        .await
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_directory_or_link_is_never_a_new_sessions_workspace() {
    let server = permissive_server().await;
    let root = server.scratch.workspaces();
    let outside = server.scratch.dir.path().join("outside");
    std::fs::create_dir_all(root.join("src")).expect("src");
    std::fs::create_dir_all(&outside).expect("outside");
    std::fs::write(root.join("src/main.rs"), "fn main() {}\n").expect("main.rs");
    std::os::unix::fs::symlink("../outside", root.join("elsewhere")).expect("link");
    std::fs::write(root.join("a-file"), "a file\n").expect("file");
    let model = calls_script(
        &server.scratch,
        "plant.jsonl",
        &[call("write_file", json!({"path": "precious", "content": "planted"}))],
    );
    for id in ["src", "elsewhere", "a-file"] {
        let reply = server
            .api
            .post(
                "/v1/sessions",
                &json!({"id": id, "model": model, "approvals": {"default": "auto"}}),
            )
            .await;
        assert_eq!(reply.status, StatusCode::CONFLICT, "{id}: {}", reply.body);
        assert_eq!(reply.code(), "workspace_exists", "{id}: {}", reply.body);
        assert!(
            reply.body["error"]["message"]
                .as_str()
                .is_some_and(|message| message.contains("is not a directory Keel created")),
            "{}",
            reply.body
        );
        assert_eq!(
            server.api.get(&format!("/v1/sessions/{id}")).await.status,
            StatusCode::NOT_FOUND,
            "{id} was stored"
        );
    }
    // The front-end protocols make a session on first use: the same
    // refusal, and their descriptions say they can answer it.
    let doc: Value = serde_json::from_str(keel::server::openapi_json()).expect("the description");
    let first_use = [
        (
            "/v1/ag-ui",
            json!({"threadId": "src", "runId": "r1", "messages": [{"id": "m1", "role": "user", "content": "hi"}]}),
        ),
        (
            "/v1/ai-sdk/chat",
            json!({"id": "src", "trigger": "submit-message",
                   "messages": [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}]}),
        ),
    ];
    for (path, body) in first_use {
        let reply = server.api.post(path, &body).await;
        assert_eq!(reply.status, StatusCode::CONFLICT, "{path}: {}", reply.body);
        assert_eq!(reply.code(), "workspace_exists", "{path}: {}", reply.body);
        let described = &doc["paths"][path]["post"]["responses"]["409"]["content"]["application/json"]["schema"]["properties"]
            ["error"]["allOf"][1]["properties"]["code"]["enum"];
        assert!(
            described
                .as_array()
                .is_some_and(|codes| codes.contains(&json!("workspace_exists"))),
            "{path} answers a code its description does not name: {described}"
        );
    }
    assert_eq!(server.api.get("/v1/sessions/src").await.status, StatusCode::NOT_FOUND);
    // A fork is a new session too: it gets a directory Keel makes, never
    // an existing one.
    server.api.create(json!({"id": "parent", "model": model})).await;
    let last = server.api.session("parent").await["last_sequence"].clone();
    let forked = server
        .api
        .post("/v1/sessions/parent/fork", &json!({"id": "src", "at_sequence": last}))
        .await;
    assert_eq!(forked.status, StatusCode::CONFLICT, "{}", forked.body);
    assert_eq!(forked.code(), "workspace_exists", "{}", forked.body);
    assert_eq!(server.api.get("/v1/sessions/src").await.status, StatusCode::NOT_FOUND);
    let forked = server
        .api
        .post("/v1/sessions/parent/fork", &json!({"id": "child", "at_sequence": last}))
        .await;
    assert_eq!(forked.status, StatusCode::CREATED, "{}", forked.body);
    assert!(
        root.join(".keel-workspaces/child").is_file(),
        "the fork's workspace is recorded"
    );
    assert_eq!(names(&root.join("src")), ["main.rs"], "src/ was touched");
    assert!(
        names(&outside).is_empty(),
        "something landed outside: {:?}",
        names(&outside)
    );
    assert_eq!(std::fs::read_to_string(root.join("a-file")).expect("file"), "a file\n");
    // A fresh id still works, in a directory Keel made.
    server
        .api
        .create(json!({"id": "fresh", "model": model, "approvals": {"default": "auto"}}))
        .await;
    server.api.say("fresh", "go").await;
    let results = tool_results(&server.api, "fresh").await;
    assert_eq!(results.len(), 1);
    assert!(!results[0].1, "{results:?}");
    assert_eq!(
        std::fs::read_to_string(root.join("fresh/precious")).expect("written"),
        "planted"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_swapped_for_a_link_or_another_directory_is_refused_not_followed() {
    let server = permissive_server().await;
    let root = server.scratch.workspaces();
    let outside = server.scratch.dir.path().join("outside");
    std::fs::create_dir_all(&outside).expect("outside");
    std::fs::write(outside.join("secret.txt"), "OUTSIDE secret\n").expect("secret");
    let model = calls_script(
        &server.scratch,
        "reach.jsonl",
        &[
            call("write_file", json!({"path": "planted.txt", "content": "planted"})),
            call("read_file", json!({"path": "secret.txt"})),
            call("list_dir", json!({})),
            call("search", json!({"pattern": "OUTSIDE"})),
        ],
    );
    for id in ["victim", "other", "borrower"] {
        server
            .api
            .create(json!({"id": id, "model": model, "tools": {"shell": false}, "approvals": {"default": "auto"}}))
            .await;
    }
    // What another session's command could do with a writable root: the
    // workspace becomes a link leading outside...
    std::fs::rename(root.join("victim"), root.join("victim-moved")).expect("move");
    std::os::unix::fs::symlink(&outside, root.join("victim")).expect("link");
    // ...or another session's directory is moved into its place.
    std::fs::rename(root.join("borrower"), root.join("borrower-moved")).expect("move");
    std::fs::rename(root.join("other"), root.join("borrower")).expect("swap");
    for id in ["victim", "borrower"] {
        server.api.say(id, "go").await;
        let results = tool_results(&server.api, id).await;
        assert_eq!(results.len(), 4, "{id}: {results:?}");
        for (output, is_error) in &results {
            assert!(
                *is_error && output.contains("is not the directory Keel created for this session"),
                "{id}: {output}"
            );
            assert!(!output.contains("OUTSIDE"), "{id} read outside: {output}");
        }
    }
    assert_eq!(names(&outside), ["secret.txt"], "a file tool wrote outside");
    assert!(
        !root.join("borrower/planted.txt").exists(),
        "a file tool wrote in another session's workspace"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_removes_only_a_directory_keel_created() {
    let server = permissive_server().await;
    let root = server.scratch.workspaces();
    let outside = server.scratch.dir.path().join("outside");
    std::fs::create_dir_all(&outside).expect("outside");
    std::fs::write(outside.join("precious"), "keep me").expect("precious");
    let model = server.scratch.script("s.jsonl", &[r#"{"text": "Hi."}"#]);
    for id in ["mine", "replaced", "linked", "legacy"] {
        server.api.create(json!({"id": id, "model": model})).await;
    }
    std::fs::write(root.join("mine/work.txt"), "work").expect("work");
    // The operator's directory, moved in where a workspace was.
    std::fs::rename(root.join("replaced"), root.join("replaced-keel")).expect("move");
    std::fs::create_dir(root.join("replaced")).expect("operator's dir");
    std::fs::write(root.join("replaced/important"), "important").expect("important");
    // A link to a directory outside in a workspace's place.
    std::fs::rename(root.join("linked"), root.join("linked-keel")).expect("move");
    std::os::unix::fs::symlink(&outside, root.join("linked")).expect("link");
    // A session from before markers: its directory has no record.
    let _ = std::fs::remove_file(root.join(".keel-workspaces/legacy"));

    for id in ["replaced", "linked", "legacy"] {
        let reply = delete(&server.api, id, true).await;
        assert_eq!(reply.status, StatusCode::CONFLICT, "{id}: {}", reply.body);
        assert_eq!(reply.code(), "workspace_not_removable", "{id}: {}", reply.body);
        // Refused before anything was deleted: the session is still there.
        assert_eq!(
            server.api.get(&format!("/v1/sessions/{id}")).await.status,
            StatusCode::OK
        );
    }
    assert_eq!(
        std::fs::read_to_string(root.join("replaced/important")).expect("kept"),
        "important"
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("precious")).expect("kept"),
        "keep me"
    );
    assert!(root.join("legacy").is_dir());

    // The one Keel created goes, contents and all.
    let reply = delete(&server.api, "mine", true).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.body);
    assert!(!root.join("mine").exists());
    // Without the flag a session goes and its directory stays, whatever it is.
    assert_eq!(
        delete(&server.api, "replaced", false).await.status,
        StatusCode::NO_CONTENT
    );
    assert!(root.join("replaced/important").exists());
    server.stop().await;
}

/// `keel serve` with its database inside the workspace root, in `data/`.
fn serve_with_database_in(scratch: &Scratch, database: &Path) -> ServeProcess {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .arg("serve")
        .arg("--create")
        .arg("--db")
        .arg(database)
        .arg("--workspace-root")
        .arg(scratch.workspaces())
        .args(["--listen", "127.0.0.1:0", "--auto-approve", "*"])
        .arg("--script-dir")
        .arg(scratch.dir.path())
        .env_remove("KEEL_MODEL")
        .env_remove("KEEL_CONFIG")
        .env_remove("KEEL_DB")
        .env("KEEL_LOG", "warn")
        .current_dir(scratch.dir.path());
    ServeProcess::spawn(command)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_named_after_the_databases_directory_reaches_nothing_of_it() {
    let scratch = Scratch::new();
    let data: PathBuf = scratch.workspaces().join("data");
    std::fs::create_dir_all(&data).expect("data");
    let database = data.join("keel.sqlite3");
    // The model's first answer is given to `keel run`; what the session does
    // once the server loads it comes next.
    let attack = json!({"tool_calls": [
        {"id": "w", "name": "write_file", "arguments": {"path": "keel.sqlite3", "content": "not a database"}},
        {"id": "l", "name": "write_file", "arguments": {"path": "keel.sqlite3-serve.lock", "content": "x"}}
    ]});
    let model = scratch.script(
        "data.jsonl",
        &[r#"{"text": "Hi."}"#, &attack.to_string(), r#"{"text": "done"}"#],
    );

    let server = serve_with_database_in(&scratch, &database);
    let reply = server
        .api
        .post(
            "/v1/sessions",
            &json!({"id": "data", "model": model, "approvals": {"default": "auto"}}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::CONFLICT, "{}", reply.body);
    assert_eq!(reply.code(), "workspace_exists");
    let (status, _) = server.terminate();
    assert!(status.success());

    // A session "data" from before markers, made by `keel run` on the same
    // database.
    let run = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["run", "--create", "--new-session", "data", "--db"])
        .arg(&database)
        .args(["--model", &model, "hello"])
        .env_remove("KEEL_MODEL")
        .env_remove("KEEL_CONFIG")
        .current_dir(scratch.dir.path())
        .output()
        .expect("keel run");
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));

    let server = serve_with_database_in(&scratch, &database);
    // Its directory holds Keel's database: never adopted as its workspace.
    let submitted = server
        .api
        .submit("data", json!({"op": {"type": "user_input", "text": "go"}}))
        .await;
    assert_eq!(submitted.status, StatusCode::CONFLICT, "{}", submitted.body);
    assert_eq!(submitted.code(), "workspace_not_keels", "{}", submitted.body);
    // Nor removed with the session.
    let deleted = delete(&server.api, "data", true).await;
    assert_eq!(deleted.status, StatusCode::CONFLICT, "{}", deleted.body);
    assert_eq!(deleted.code(), "workspace_not_removable", "{}", deleted.body);
    // The database is whole, and the server answers.
    assert!(
        std::fs::read(&database)
            .expect("database")
            .starts_with(b"SQLite format 3\0")
    );
    let listed = server.api.get("/v1/sessions").await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    assert_eq!(listed.body["sessions"][0]["id"], "data", "{}", listed.body);
    let (status, _) = server.terminate();
    assert!(status.success());
}
