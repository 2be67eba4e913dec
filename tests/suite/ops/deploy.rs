//! The files of `deploy/`: the systemd unit passes `systemd-analyze
//! verify`, keeps what the shell sandbox needs, and its command line (like
//! the container's) starts the real `keel serve`; the Dockerfile has the
//! shape docs/operations.md promises; the nginx and Caddy examples pass
//! their own checkers. Tests whose checker is missing say `SKIPPED`, and
//! fail where they are required (`CI`, `KEEL_REQUIRE_DEPLOY_TESTS=1`);
//! `scripts/test` provides the checkers.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use reqwest::StatusCode;

use crate::suite::support::server::ServeProcess;
use crate::suite::support::skip;

const REQUIRE: &str = "KEEL_REQUIRE_DEPLOY_TESTS";

fn deploy(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy").join(name)
}

fn read(name: &str) -> String {
    std::fs::read_to_string(deploy(name)).unwrap_or_else(|error| panic!("deploy/{name}: {error}"))
}

/// `program` on `PATH`, or `None` after saying the test is skipped (a
/// panic where the test is required).
pub(super) fn checker(test: &str, program: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .map(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(program))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
        .into_iter()
        .find(|path| path.is_file());
    if found.is_none() {
        let why = format!("{program} is not on PATH (scripts/test provides it)");
        assert!(
            skip::may_skip(REQUIRE),
            "{test}: {why}, and the deploy tests are required"
        );
        skip::announce(test, &why);
    }
    found
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The unit's `ExecStart=` command line, continuation lines joined, split
/// into words.
fn exec_start(unit: &str) -> Vec<String> {
    let joined = unit.replace("\\\n", " ");
    let line = joined
        .lines()
        .find_map(|line| line.strip_prefix("ExecStart="))
        .expect("an ExecStart= line");
    line.split_whitespace().map(str::to_owned).collect()
}

/// The values of `key=` in the unit, in order.
fn settings<'a>(unit: &'a str, key: &str) -> Vec<&'a str> {
    let prefix = format!("{key}=");
    unit.lines()
        .filter_map(|line| line.strip_prefix(prefix.as_str()))
        .collect()
}

#[test]
fn the_systemd_unit_verifies_and_keeps_what_the_sandbox_needs() {
    let unit = read("keel.service");
    for (key, value) in [
        ("DynamicUser", "yes"),
        ("StateDirectory", "keel"),
        ("StateDirectoryMode", "0700"),
        ("ProtectSystem", "strict"),
        ("NoNewPrivileges", "yes"),
        ("PrivateTmp", "yes"),
        ("CapabilityBoundingSet", ""),
        ("LoadCredential", "token:/etc/keel/token"),
    ] {
        assert_eq!(settings(&unit, key), [value], "{key}= in deploy/keel.service");
    }
    // Each of these would take from the sandbox what it needs: namespaces,
    // a fresh /proc, its own syscalls.
    for key in [
        "RestrictNamespaces",
        "PrivateUsers",
        "ProtectKernelTunables",
        "ProtectKernelLogs",
        "ProtectProc",
        "ProcSubset",
        "SystemCallFilter",
        "MemoryDenyWriteExecute",
    ] {
        assert!(settings(&unit, key).is_empty(), "{key}= would break the sandbox");
    }

    let Some(analyze) = checker(
        "the_systemd_unit_verifies_and_keeps_what_the_sandbox_needs",
        "systemd-analyze",
    ) else {
        return;
    };
    // `verify` checks that the commands exist: point them at this build.
    let dir = tempfile::tempdir().expect("unit directory");
    let mut paths = Vec::new();
    for name in ["keel.service", "keel-backup.service", "keel-backup.timer"] {
        let path = dir.path().join(name);
        std::fs::write(&path, installed(&read(name))).expect("write the unit");
        paths.push(path);
    }
    let output = Command::new(analyze)
        .arg("verify")
        .args(&paths)
        .output()
        .expect("run systemd-analyze");
    let out = text(&output);
    assert!(output.status.success(), "{out}");
    // Unknown keys and bad values are warnings, not failures: none at all.
    assert!(!out.contains("keel"), "systemd-analyze has remarks: {out}");
}

/// A unit as installed with this build's binary.
fn installed(unit: &str) -> String {
    unit.replace("/usr/local/bin/keel", env!("CARGO_BIN_EXE_keel"))
}

/// Expands the specifiers a unit's command line uses: `%S` (the state
/// directories' root) and `%%`.
fn expand(line: &str, state: &Path) -> String {
    line.replace("%%", "\0")
        .replace("%S", state.to_str().expect("utf-8"))
        .replace("\0", "%")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backup_unit_runs_as_the_servers_user_and_copies_the_database() {
    let backup = read("keel-backup.service");
    // The dynamic user of keel.service is named after its unit: sharing it
    // keeps every file of the database the server's.
    assert_eq!(settings(&backup, "DynamicUser"), ["yes"]);
    assert_eq!(settings(&backup, "User"), ["keel"]);
    assert!(
        settings(&read("keel.service"), "User").is_empty(),
        "keel.service's user is its unit's name"
    );
    assert_eq!(settings(&backup, "StateDirectory"), ["keel keel-backups"]);

    let state = tempfile::tempdir().expect("state directory");
    for dir in ["keel", "keel-backups"] {
        std::fs::create_dir(state.path().join(dir)).expect("StateDirectory=");
    }
    let store = keel::store::SqliteCheckpoint::new(state.path().join("keel/keel.sqlite3")).expect("a database");
    keel::store::CheckpointStore::close(&store).await;
    let [exec] = settings(&backup, "ExecStart")[..] else {
        panic!("one ExecStart=");
    };
    let script = exec
        .strip_prefix("/bin/sh -c '")
        .and_then(|rest| rest.strip_suffix('\''))
        .expect("ExecStart=/bin/sh -c '…'");
    let output = Command::new("/bin/sh")
        .arg("-c")
        .arg(expand(&installed(script), state.path()))
        .output()
        .expect("run the backup");
    assert!(output.status.success(), "{}", text(&output));
    let copies: Vec<PathBuf> = std::fs::read_dir(state.path().join("keel-backups"))
        .expect("backups")
        .map(|entry| entry.expect("entry").path())
        .collect();
    assert_eq!(copies.len(), 1, "{copies:?}");
    let name = copies[0].file_name().and_then(|name| name.to_str()).expect("name");
    assert!(
        name.starts_with("keel-20") && name.ends_with("Z.sqlite3"),
        "dated by the run: {name}"
    );
    keel::store::SqliteCheckpoint::new(&copies[0]).expect("the copy is a Keel database");
}

/// Starts the real binary with `args` (the `keel` of a unit or an image)
/// with the given state directory and token file, and checks that it
/// serves, and keeps its database where the files promise.
async fn starts(args: &[String], data_home: &Path, database: &Path) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(args)
        .env("XDG_DATA_HOME", data_home)
        .env("XDG_CONFIG_HOME", data_home.join("etc"))
        .env_remove("KEEL_DB")
        .env_remove("KEEL_MODEL")
        .env_remove("KEEL_CONFIG")
        .env("KEEL_LOG", "warn")
        .current_dir(data_home);
    let server = ServeProcess::spawn(command);
    for path in ["/healthz", "/readyz"] {
        let reply = server.api.get(path).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}");
    }
    assert!(database.is_file(), "the database is at {}", database.display());
    let (status, lines) = server.terminate();
    assert!(status.success(), "{lines:?}");
}

/// A token file for a server, in `dir`.
fn token_file(dir: &Path) -> PathBuf {
    let path = dir.join("token");
    std::fs::write(&path, "a-token-of-the-operator\n").expect("token");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_units_command_line_serves_with_its_database_in_the_state_directory() {
    let unit = read("keel.service");
    let state = tempfile::tempdir().expect("state directory");
    let credentials = tempfile::tempdir().expect("credentials");
    token_file(credentials.path());
    let [data_home] = settings(&unit, "Environment")
        .into_iter()
        .filter_map(|setting| setting.strip_prefix("XDG_DATA_HOME="))
        .collect::<Vec<_>>()[..]
    else {
        panic!("one XDG_DATA_HOME= in the unit");
    };
    assert_eq!(data_home, "%S", "the data home is the state directories' root");
    let args: Vec<String> = exec_start(&unit)[1..]
        .iter()
        .map(|arg| {
            arg.replace("%d", credentials.path().to_str().expect("utf-8"))
                .replace("%S", state.path().to_str().expect("utf-8"))
                .replace("127.0.0.1:7777", "127.0.0.1:0")
        })
        .collect();
    std::fs::create_dir(state.path().join("keel")).expect("StateDirectory=keel");
    starts(&args, state.path(), &state.path().join("keel/keel.sqlite3")).await;
}

/// The final stage of a multi-stage Dockerfile: its instructions from the
/// last `FROM`, continuation lines joined.
fn final_stage(dockerfile: &str) -> Vec<String> {
    let joined = dockerfile.replace("\\\n", " ");
    let lines: Vec<String> = joined.lines().map(|line| line.trim().to_owned()).collect();
    let last = lines
        .iter()
        .rposition(|line| line.starts_with("FROM "))
        .expect("a FROM");
    lines[last..].to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dockerfile_builds_in_a_stage_of_its_own_and_runs_keel_unprivileged_on_a_volume() {
    let dockerfile = read("Dockerfile");
    let stages = dockerfile.lines().filter(|line| line.starts_with("FROM ")).count();
    assert!(stages >= 2, "a build stage and a runtime stage");
    assert!(
        dockerfile.contains("cargo build --release --locked"),
        "built from Cargo.lock"
    );
    let runtime = final_stage(&dockerfile);
    let instruction = |name: &str| -> Vec<&str> {
        runtime
            .iter()
            .filter_map(|line| line.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .collect()
    };
    assert!(
        instruction("HEALTHCHECK")
            .iter()
            .any(|check| check.contains("http://127.0.0.1:7777/healthz")),
        "a health check on /healthz"
    );
    let user = instruction("USER");
    assert_eq!(user.len(), 1, "one USER in the runtime stage");
    assert!(
        !["root", "0"].contains(&user[0].split(':').next().expect("user")),
        "not root: {user:?}"
    );
    assert_eq!(instruction("VOLUME"), [r#"["/var/lib/keel"]"#]);
    assert!(
        dockerfile.contains("XDG_DATA_HOME=/var/lib"),
        "the database is on the volume"
    );
    let ignored = read("Dockerfile.dockerignore");
    for pattern in ["**/target", "**/node_modules", ".git"] {
        assert!(
            ignored.lines().any(|line| line == pattern),
            "{pattern} stays out of the context"
        );
    }

    // The image's command line, against this build: it serves, on a
    // token, with the database in the volume.
    let cmd = instruction("CMD");
    assert_eq!(cmd.len(), 1, "one CMD");
    let args: Vec<String> = serde_json::from_str(cmd[0]).expect("CMD in exec form");
    let volume = tempfile::tempdir().expect("the volume's parent");
    let token = token_file(volume.path());
    let root = volume.path().to_str().expect("utf-8");
    let args: Vec<String> = args
        .iter()
        .map(|arg| {
            arg.replace("/run/secrets/keel_token", token.to_str().expect("utf-8"))
                .replace("/var/lib", root)
                .replace("0.0.0.0:7777", "0.0.0.0:0")
        })
        .collect();
    std::fs::create_dir(volume.path().join("keel")).expect("the volume");
    starts(&args, volume.path(), &volume.path().join("keel/keel.sqlite3")).await;
}

#[test]
fn the_nginx_example_passes_nginx_t_with_the_streaming_settings() {
    let site = read("nginx.conf");
    for setting in [
        "proxy_buffering off;",
        "proxy_read_timeout 1h;",
        "proxy_http_version 1.1;",
        "proxy_set_header Upgrade $http_upgrade;",
        "proxy_set_header Connection $keel_connection;",
        "proxy_set_header Host $http_host;",
    ] {
        assert!(site.contains(setting), "deploy/nginx.conf: {setting}");
    }
    let Some(nginx) = checker("the_nginx_example_passes_nginx_t_with_the_streaming_settings", "nginx") else {
        return;
    };
    let dir = tempfile::tempdir().expect("nginx prefix");
    let prefix = dir.path().to_str().expect("utf-8");
    let certificate = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"])
        .args(["-subj", "/CN=keel.example.com", "-keyout"])
        .arg(dir.path().join("key.pem"))
        .arg("-out")
        .arg(dir.path().join("cert.pem"))
        .output()
        .expect("run openssl");
    assert!(certificate.status.success(), "{}", text(&certificate));
    let site = site
        .replace(
            "/etc/letsencrypt/live/keel.example.com/fullchain.pem",
            &format!("{prefix}/cert.pem"),
        )
        .replace(
            "/etc/letsencrypt/live/keel.example.com/privkey.pem",
            &format!("{prefix}/key.pem"),
        )
        .replace("/var/log/nginx/", &format!("{prefix}/logs/"));
    std::fs::write(dir.path().join("keel.conf"), site).expect("site");
    // The example is a conf.d file: included inside `http {}`.
    let temp: String = ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"]
        .iter()
        .map(|kind| format!("{kind}_temp_path {prefix}/{kind};\n"))
        .collect();
    let main = format!(
        "pid {prefix}/nginx.pid;\nerror_log {prefix}/error.log;\nevents {{}}\n\
         http {{\naccess_log off;\n{temp}include {prefix}/keel.conf;\n}}\n"
    );
    std::fs::write(dir.path().join("nginx.conf"), main).expect("main config");
    std::fs::create_dir(dir.path().join("logs")).expect("logs");
    let output = Command::new(nginx)
        .args(["-t", "-p", prefix, "-c"])
        .arg(dir.path().join("nginx.conf"))
        .output()
        .expect("run nginx -t");
    assert!(output.status.success(), "{}", text(&output));
    assert!(text(&output).contains("test is successful"), "{}", text(&output));
}

#[test]
fn the_caddy_example_passes_caddy_validate_with_the_streaming_settings() {
    let site = read("Caddyfile");
    for setting in ["reverse_proxy 127.0.0.1:7777", "flush_interval -1", "read_timeout 1h"] {
        assert!(site.contains(setting), "deploy/Caddyfile: {setting}");
    }
    let Some(caddy) = checker(
        "the_caddy_example_passes_caddy_validate_with_the_streaming_settings",
        "caddy",
    ) else {
        return;
    };
    let home = tempfile::tempdir().expect("caddy's home");
    let output = Command::new(caddy)
        .args(["validate", "--adapter", "caddyfile", "--config"])
        .arg(deploy("Caddyfile"))
        .env("HOME", home.path())
        .env("XDG_DATA_HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path())
        .output()
        .expect("run caddy validate");
    assert!(output.status.success(), "{}", text(&output));
    assert!(text(&output).contains("Valid configuration"), "{}", text(&output));
}
