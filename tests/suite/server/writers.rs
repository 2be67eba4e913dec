//! One writer per database: a second `keel serve` on a served database, a
//! CLI command on a session the server holds, a database deleted while
//! the server uses it, and a `-shm` file it cannot write. All over real
//! processes, files and loopback HTTP.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use crate::suite::support::process::wait_exit;
use crate::suite::support::server::{Scratch, ServeProcess};

/// Runs `command` to its end, failing the test if it is still running
/// after `limit`; returns its status and stderr.
fn run_to_end(mut command: Command, limit: Duration) -> (std::process::ExitStatus, String) {
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn keel");
    let Some(status) = wait_exit(&mut child, limit) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the command was still running after {limit:?}: {command:?}");
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    (status, stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_keel_serve_on_the_same_database_refuses_to_start_and_names_the_first() {
    let scratch = Scratch::new();
    let first = ServeProcess::start(&scratch, &[]);
    let command = ServeProcess::command(&scratch, &[]);
    let (status, stderr) = tokio::task::spawn_blocking(move || run_to_end(command, Duration::from_secs(20)))
        .await
        .expect("second server");
    assert!(!status.success(), "{stderr}");
    let pid = first.pid();
    assert!(
        stderr.contains(&format!("already served by keel serve (pid {pid}, {})", first.api.base)),
        "{stderr}"
    );
    assert!(stderr.contains("refusing to start"), "{stderr}");
    // The first one goes on serving.
    assert_eq!(first.api.get("/readyz").await.status, StatusCode::OK);

    // Once it stopped, the database can be served again.
    let (status, _) = tokio::task::spawn_blocking(move || first.terminate())
        .await
        .expect("stop");
    assert!(status.success());
    let again = ServeProcess::start(&scratch, &[]);
    assert_eq!(again.api.get("/readyz").await.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keel_run_on_a_session_a_server_holds_says_so_and_leaves_the_session_to_the_server() {
    let scratch = Scratch::new();
    let model = scratch.script("s.jsonl", &[r#"{"text": "one"}"#, r#"{"text": "two"}"#]);
    let server = ServeProcess::start(&scratch, &[]);
    server.api.create(json!({"id": "demo", "model": model})).await;
    server.api.say("demo", "first").await;
    server.api.wait_idle("demo").await;

    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(["run", "--no-tools", "--session", "demo", "--model", &model, "--db"])
        .arg(scratch.db())
        .arg("from the terminal")
        .env_remove("KEEL_CONFIG")
        .env("KEEL_LOG", "warn")
        .current_dir(scratch.dir.path());
    let (status, stderr) = tokio::task::spawn_blocking(move || run_to_end(command, Duration::from_secs(30)))
        .await
        .expect("keel run");
    assert!(!status.success(), "keel run took the session: {stderr}");
    let pid = server.pid();
    assert!(
        stderr.contains(&format!(
            "session 'demo' is served by keel serve (pid {pid}, {})",
            server.api.base
        )),
        "{stderr}"
    );
    assert!(stderr.contains("keel chat --server"), "{stderr}");

    // The server still has the session: its next message runs.
    server.api.say("demo", "second").await;
    server.api.wait_idle("demo").await;
    let stored = scratch.stored("demo").await;
    let completed = stored
        .iter()
        .filter(|event| event.msg.kind() == "turn_complete")
        .count();
    assert_eq!(
        completed,
        2,
        "{:?}",
        stored.iter().map(|e| e.msg.kind()).collect::<Vec<_>>()
    );
    assert!(
        stored
            .iter()
            .all(|event| event.msg.kind() != "session_started" || event.sequence == 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_deleted_while_serving_fails_closed_and_is_not_ready() {
    let scratch = Scratch::new();
    let model = scratch.script("s.jsonl", &[r#"{"text": "one"}"#, r#"{"text": "two"}"#]);
    let server = ServeProcess::start(&scratch, &[]);
    server.api.create(json!({"id": "doomed", "model": model})).await;
    server.api.say("doomed", "first").await;
    server.api.wait_idle("doomed").await;
    assert_eq!(server.api.get("/readyz").await.status, StatusCode::OK);

    std::fs::remove_file(scratch.db()).expect("delete the database");
    let ready = server.api.get("/readyz").await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    // Nothing more is acknowledged: it would be gone after a restart.
    let reply = server
        .api
        .submit("doomed", json!({"op": {"type": "user_input", "text": "lost?"}}))
        .await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{}", reply.body);
    let created = server
        .api
        .post("/v1/sessions", &json!({"id": "new", "model": model}))
        .await;
    assert_eq!(created.status, StatusCode::SERVICE_UNAVAILABLE, "{}", created.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_shm_file_is_refused_at_start_with_a_message_naming_it() {
    let scratch = Scratch::new();
    // Root writes through any mode: the server runs as nobody then.
    let unprivileged = nix::unistd::geteuid().is_root().then_some(65534);
    let binary = crate::suite::support::process::keel_binary_for(unprivileged, scratch.dir.path());
    let start = |scratch: &Scratch| {
        let mut command = ServeProcess::command_of(&binary, scratch, &[]);
        if let Some(uid) = unprivileged {
            std::os::unix::process::CommandExt::uid(&mut command, uid);
            std::os::unix::process::CommandExt::gid(&mut command, uid);
        }
        command
    };
    if let Some(uid) = unprivileged {
        let status = Command::new("chown")
            .args(["-R", &format!("{uid}:{uid}")])
            .arg(scratch.dir.path())
            .status()
            .expect("chown");
        assert!(status.success());
    }
    // A crashed server leaves its `-shm` behind.
    let first = ServeProcess::spawn(start(&scratch));
    first.api.get("/readyz").await;
    first.crash();
    let shm = scratch.dir.path().join("keel.sqlite3-shm");
    assert!(shm.exists(), "the crash left no -shm file");
    let mut permissions = std::fs::metadata(&shm).expect("-shm").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o444);
    std::fs::set_permissions(&shm, permissions).expect("chmod the -shm file");

    let command = start(&scratch);
    let (status, stderr) = tokio::task::spawn_blocking(move || run_to_end(command, Duration::from_secs(20)))
        .await
        .expect("second start");
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("shared-memory file {} is not writable", shm.display())),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keel_serve_refuses_to_start_while_keel_run_has_a_session_open_on_the_database() {
    let scratch = Scratch::new();
    let slow = crate::suite::support::server::slow_chunks(200, 100);
    let model = scratch.script("slow.jsonl", &[&slow]);
    let mut run = Command::new(env!("CARGO_BIN_EXE_keel"));
    run.args(["run", "--create", "--json", "--no-tools", "--model", &model, "--db"])
        .arg(scratch.db())
        .arg("a long answer")
        .env_remove("KEEL_CONFIG")
        .env("KEEL_LOG", "warn")
        .current_dir(scratch.dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut run = run.spawn().expect("spawn keel run");
    // Its turn is in flight once it started.
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(run.stdout.take().expect("stdout")));
    // The reader is kept: a closed stdout would end keel run.
    let (started, _lines) = tokio::task::spawn_blocking(move || {
        let started = lines
            .by_ref()
            .map_while(Result::ok)
            .any(|line| line.contains("\"turn_started\""));
        (started, lines)
    })
    .await
    .expect("read keel run");
    assert!(started, "keel run streamed nothing");

    let command = ServeProcess::command(&scratch, &[]);
    let (status, stderr) = tokio::task::spawn_blocking(move || run_to_end(command, Duration::from_secs(20)))
        .await
        .expect("keel serve");
    assert!(!status.success(), "keel serve started beside keel run: {stderr}");
    assert!(
        stderr.contains("is already served by keel run or keel chat"),
        "{stderr}"
    );
    assert_eq!(run.try_wait().expect("keel run"), None, "keel run was disturbed");
    run.kill().expect("kill keel run");
    run.wait().expect("reap keel run");
}
