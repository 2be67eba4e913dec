//! What an operator meets: the start banner of `keel serve`, database
//! files readable by their owner only, a mistyped `--db` refused instead of
//! a new empty database, and error texts that say what failed and what to
//! do (PostgreSQL login, missing database, TLS; a port in use; a model
//! without its API key).

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use keel::store::postgres::local::LocalPostgres;

use crate::suite::support::process::{Cli, assert_one_line_error, stderr};
use crate::suite::support::server::{Scratch, ServeProcess};

/// `keel serve ARGS` in `cli`'s directory, with no model or config from
/// the environment.
fn serve(cli: &Cli, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .arg("serve")
        .args(args)
        .env_remove("KEEL_MODEL")
        .env_remove("KEEL_CONFIG")
        .env_remove("KEEL_DB")
        .env("KEEL_LOG", "warn")
        .current_dir(cli.dir.path());
    command
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

#[test]
fn the_banner_names_the_database_config_model_root_address_auth_and_sandbox() {
    let scratch = Scratch::new();
    let config = scratch.dir.path().join("keel.toml");
    std::fs::write(&config, "[server]\nmax_sandbox = \"read-only\"\n").expect("keel.toml");
    let script = scratch.script("s.jsonl", &[r#"{"text": "hi"}"#]);
    let config_arg = config.display().to_string();
    let server = ServeProcess::start(&scratch, &["--config", &config_arg, "--model", &script]);
    let base = server.api.base.clone();
    let (status, lines) = server.terminate();
    assert!(status.success(), "{lines:?}");
    let banner = lines.join("\n");
    let db = scratch.db().display().to_string();
    let root = scratch.workspaces().canonicalize().expect("root").display().to_string();
    for expected in [
        "keel serve 0.",
        "commit ",
        &format!("database:       {db}"),
        &format!("config:         {config_arg}"),
        &format!("default model:  {script}"),
        &format!("workspace root: {root}"),
        &format!("listen:         {base}"),
        "auth:           none: no token, so loopback clients only",
        "sandbox:",
        "clients may ask for up to read-only",
    ] {
        assert!(banner.contains(expected), "{expected:?} missing from {banner}");
    }
    // The line clients wait for comes after the banner.
    let listening = lines
        .iter()
        .position(|line| line.starts_with("keel serve listening on"));
    let sandbox = lines.iter().position(|line| line.contains("sandbox:"));
    assert!(sandbox < listening, "{lines:?}");
}

#[test]
fn new_database_files_are_the_owners_only_and_a_created_directory_too() {
    let cli = Cli::new();
    let db = cli.dir.path().join("state").join("deeper").join("keel.sqlite3");
    let db_arg = db.display().to_string();
    let script = cli.script("s.jsonl", &[r#"{"text": "stored"}"#]);
    let model = format!("script:{}", script.display());
    let scripts = cli.dir.path().display().to_string();
    let root = cli.dir.path().join("workspaces").display().to_string();
    let server = ServeProcess::spawn(serve(
        &cli,
        &[
            "--create",
            "--db",
            &db_arg,
            "--listen",
            "127.0.0.1:0",
            "--script-dir",
            &scripts,
            "--workspace-root",
            &root,
        ],
    ));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        server.api.create(serde_json::json!({"id": "s", "model": model})).await;
        server.api.say("s", "hello").await;
        server.api.wait_idle("s").await;
    });
    for suffix in ["", "-wal", "-shm", "-serve.lock"] {
        let file = std::path::PathBuf::from(format!("{db_arg}{suffix}"));
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }
    assert_eq!(mode(db.parent().expect("dir")), 0o700);
    assert_eq!(mode(&cli.dir.path().join("state")), 0o700);
    drop(server);
}

#[test]
fn a_db_path_that_does_not_exist_needs_create() {
    let cli = Cli::new();
    let missing = cli.dir.path().join("typo.sqlite3");
    let missing_arg = missing.display().to_string();
    let output = serve(&cli, &["--db", &missing_arg, "--listen", "127.0.0.1:0"])
        .output()
        .expect("keel serve");
    assert_one_line_error(&output, &format!("no database at {missing_arg}: pass --create"));
    assert!(!missing.exists());
    let script = cli.script("s.jsonl", &[r#"{"text": "hi"}"#]);
    let model = format!("script:{}", script.display());
    let run = cli.run(&["run", "--db", &missing_arg, "--model", &model, "hi"]);
    assert_one_line_error(&run, "pass --create");
    assert!(!missing.exists());
    let created = cli.run(&["run", "--create", "--db", &missing_arg, "--model", &model, "hi"]);
    assert!(created.status.success(), "{}", stderr(&created));
    assert!(missing.exists());
}

#[test]
fn a_port_in_use_names_listen() {
    let cli = Cli::new();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = taken.local_addr().expect("address").to_string();
    let db = cli.db().display().to_string();
    let output = serve(&cli, &["--create", "--db", &db, "--listen", &address])
        .output()
        .expect("keel serve");
    assert_one_line_error(&output, "the address is in use");
    assert!(stderr(&output).contains("--listen"), "{}", stderr(&output));
}

#[test]
fn a_model_without_its_key_names_the_spec_and_the_variable() {
    let cli = Cli::new();
    let output = cli
        .command(&["run", "--model", "openai:gpt-4.1-mini", "hi"])
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("KEEL_CONFIG")
        .output()
        .expect("keel run");
    assert_one_line_error(
        &output,
        "model 'openai:gpt-4.1-mini' (openai provider) needs an API key: set OPENAI_API_KEY",
    );
}

#[test]
fn postgresql_login_missing_database_and_tls_errors_say_what_failed() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    let cli = Cli::new();
    let existing = postgres.fresh_database();
    let port = postgres.port();
    for (url, expected) in [
        (
            format!("postgres://nobody@127.0.0.1:{port}/postgres"),
            "PostgreSQL refused the login (authentication failed)",
        ),
        (
            postgres.url("no_such_database"),
            "the PostgreSQL database does not exist: create it",
        ),
        (format!("{existing}?sslmode=require"), "TLS to PostgreSQL failed"),
    ] {
        let output = serve(&cli, &["--db", &url, "--listen", "127.0.0.1:0"])
            .output()
            .expect("keel serve");
        let text = stderr(&output);
        assert!(!output.status.success(), "{url}: {text}");
        assert!(text.contains(expected), "{url}: {text}");
        assert!(!text.contains("refusing to start"), "{url}: {text}");
    }
}

#[test]
fn the_banner_shows_a_postgresql_url_without_its_password() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    let cli = Cli::new();
    // The test server trusts every login, so any password is accepted.
    let url = postgres
        .fresh_database()
        .replacen("postgres@", "postgres:hunter2-banner@", 1);
    let root = cli.dir.path().join("workspaces").display().to_string();
    let server = ServeProcess::spawn({
        let mut command = serve(&cli, &["--listen", "127.0.0.1:0", "--workspace-root", &root]);
        command.env("KEEL_DB", &url);
        command
    });
    let (status, lines) = server.terminate();
    assert!(status.success(), "{lines:?}");
    let banner = lines.join("\n");
    assert!(!banner.contains("hunter2-banner"), "{banner}");
    assert!(
        banner.contains(&format!("database:       {}", url.replace("hunter2-banner", "***"))),
        "{banner}"
    );
}
