//! The file tools against Keel's own files, with `keel run`'s defaults as
//! outside testing used them: the workspace is the current directory, which
//! also holds the database (`--db ./state.sqlite3`, with its WAL and the
//! lock `keel serve` would take) and `./keel.toml` with a secret in a
//! `[models]` header. No file tool may read, list, search, create, replace or
//! edit any of them, by any path (a hard link included), whatever the
//! approval; and the sessions survive.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use keel::protocol::RecordedEvent;
use serde_json::{Value, json};

use crate::suite::support::events::tool_results;

/// What only `keel.toml` holds; seeing it in a result is a leak.
const CANARY: &str = "hdr-canary-7f3a";

/// A project directory `keel run` is started in, and a directory beside it
/// for the scripts (so they are not part of what is listed).
struct Project {
    _dir: tempfile::TempDir,
    root: PathBuf,
    scripts: PathBuf,
}

impl Project {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().join("project");
        let scripts = dir.path().join("scripts");
        std::fs::create_dir_all(&root).expect("project");
        std::fs::create_dir_all(&scripts).expect("scripts");
        std::fs::write(
            root.join("keel.toml"),
            format!(
                "[models.remote]\nprovider = \"openai\"\nmodel = \"m\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
                 headers = {{ \"X-Api-Secret\" = \"{CANARY}\" }}\n"
            ),
        )
        .expect("keel.toml");
        std::fs::write(root.join("notes.txt"), "ordinary notes\n").expect("notes");
        Self {
            _dir: dir,
            root,
            scripts,
        }
    }

    /// `keel run --json --approve auto --db ./state.sqlite3` in the project
    /// with a script making `calls` in one step, then answering `done`.
    fn run(&self, name: &str, calls: &[Value]) -> Output {
        let calls: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(index, call)| {
                json!({"id": format!("call-{index}"), "name": call["name"], "arguments": call["arguments"]})
            })
            .collect();
        let script = self.scripts.join(format!("{name}.jsonl"));
        let lines = [
            json!({"tool_calls": calls}).to_string(),
            r#"{"text": "done"}"#.to_owned(),
        ];
        std::fs::write(&script, lines.join("\n")).expect("script");
        self.keel(&[
            "run",
            "--json",
            "--approve",
            "auto",
            "--create",
            "--db",
            "./state.sqlite3",
            "--model",
            &format!("script:{}", script.display()),
            "go",
        ])
    }

    fn keel(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_keel"))
            .args(args)
            .env_remove("KEEL_DB")
            .env_remove("KEEL_MODEL")
            .env_remove("KEEL_CONFIG")
            .env("KEEL_LOG", "warn")
            .current_dir(&self.root)
            .output()
            .expect("run keel")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }
}

fn call(name: &str, arguments: Value) -> Value {
    json!({"name": name, "arguments": arguments})
}

/// The tool results of a successful `keel run --json`, in call order.
fn results_of(output: &Output) -> Vec<(String, bool)> {
    assert!(
        output.status.success(),
        "keel run failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let events: Vec<RecordedEvent> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("event line"))
        .collect();
    let mut results = tool_results(&events);
    results.sort_by_key(|(call_id, _, _)| call_id.trim_start_matches("call-").parse::<usize>().unwrap_or(0));
    results.into_iter().map(|(_, output, error)| (output, error)).collect()
}

fn assert_refused(result: &(String, bool), what: &str) {
    assert!(
        result.1 && result.0.contains("is one of Keel's protected files"),
        "{what}: expected a refusal, got {result:?}"
    );
    assert!(!result.0.contains(CANARY), "{what} leaked the secret: {result:?}");
}

/// The sessions `keel sessions` lists, which fails if the database is not a
/// Keel database any more.
fn sessions(project: &Project) -> String {
    let output = project.keel(&["sessions", "--db", "./state.sqlite3"]);
    assert!(
        output.status.success(),
        "the database is damaged: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn sha(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_default()
}

#[test]
fn the_file_tools_refuse_keels_configuration_by_every_path() {
    let project = Project::new();
    // Another path to the same file: the tools must know it by identity.
    std::fs::hard_link(project.path("keel.toml"), project.path("innocent.txt")).expect("hard link");
    let config_before = sha(&project.path("keel.toml"));
    let output = project.run(
        "config",
        &[
            call("read_file", json!({"path": "keel.toml"})),
            call("read_file", json!({"path": "innocent.txt"})),
            call(
                "read_file",
                json!({"path": project.path("keel.toml").to_str().unwrap()}),
            ),
            call("search", json!({"pattern": "canary"})),
            call("list_dir", json!({})),
            call(
                "edit_file",
                json!({"path": "keel.toml", "old_string": CANARY, "new_string": "stolen"}),
            ),
            call("write_file", json!({"path": "keel.toml", "content": "[models]\n"})),
        ],
    );
    let results = results_of(&output);
    assert_eq!(results.len(), 7, "{results:?}");
    assert_refused(&results[0], "read_file keel.toml");
    assert_refused(&results[1], "read_file of a hard link to keel.toml");
    assert_refused(&results[2], "read_file of keel.toml by its absolute path");
    assert!(!results[3].1, "{:?}", results[3]);
    assert!(
        !results[3].0.contains(CANARY),
        "search leaked the secret: {:?}",
        results[3]
    );
    let listing = &results[4].0;
    assert!(!results[4].1 && listing.contains("notes.txt"), "{listing}");
    for hidden in ["keel.toml", "innocent.txt", "state.sqlite3"] {
        assert!(
            !listing.lines().any(|line| line.starts_with(hidden)),
            "list_dir shows {hidden}: {listing}"
        );
    }
    assert_refused(&results[5], "edit_file keel.toml");
    assert_refused(&results[6], "write_file keel.toml");
    assert_eq!(sha(&project.path("keel.toml")), config_before, "keel.toml was changed");
}

#[test]
fn the_file_tools_never_replace_the_database_its_sidecars_or_the_lock() {
    let project = Project::new();
    // A first session, so that there is something to lose.
    let first = project.run("first", &[call("read_file", json!({"path": "notes.txt"}))]);
    assert!(!results_of(&first)[0].1);
    let listed = sessions(&project);
    assert_eq!(listed.lines().count(), 1, "{listed}");
    std::fs::hard_link(project.path("state.sqlite3"), project.path("copy.db")).expect("hard link");
    let database_before = sha(&project.path("state.sqlite3"));

    let output = project.run(
        "attack",
        &[
            call(
                "write_file",
                json!({"path": "state.sqlite3", "content": "not a database"}),
            ),
            call("read_file", json!({"path": "copy.db"})),
            call("write_file", json!({"path": "copy.db", "content": "x"})),
            call("write_file", json!({"path": "state.sqlite3-wal", "content": "x"})),
            call("write_file", json!({"path": "state.sqlite3-journal", "content": "x"})),
            call(
                "write_file",
                json!({"path": "state.sqlite3-serve.lock", "content": "keel serve (pid 1)"}),
            ),
            call("read_file", json!({"path": "state.sqlite3-serve.lock"})),
        ],
    );
    let results = results_of(&output);
    assert_eq!(results.len(), 7, "{results:?}");
    assert_refused(&results[0], "write_file state.sqlite3");
    assert_refused(&results[1], "read_file of a hard link to the database");
    assert_refused(&results[2], "write_file over a hard link to the database");
    assert_refused(&results[3], "write_file of the WAL");
    assert_refused(&results[4], "write_file of the journal");
    assert_refused(&results[5], "write_file of the server's lock");
    assert_refused(&results[6], "read_file of the server's lock");
    assert!(!project.path("state.sqlite3-journal").exists());
    assert_ne!(
        std::fs::read_to_string(project.path("state.sqlite3-serve.lock")).unwrap_or_default(),
        "keel serve (pid 1)"
    );
    assert!(sha(&project.path("state.sqlite3")).starts_with(b"SQLite format 3\0"));
    assert!(!database_before.is_empty());

    // Every session survived, and the next `keel run` works.
    let next = project.run("next", &[call("read_file", json!({"path": "notes.txt"}))]);
    assert!(!results_of(&next)[0].1);
    assert_eq!(sessions(&project).lines().count(), 3, "{}", sessions(&project));
}
