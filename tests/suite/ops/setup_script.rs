//! `scripts/test --check`: what the test command would install, decided
//! from what is on `PATH`, here a directory of stubs standing for a
//! machine's tools. The real installs are run by `.ci/run`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A directory standing for a machine's `PATH`.
struct Machine {
    dir: tempfile::TempDir,
}

impl Machine {
    /// A machine with `cargo`, `apt-get` and the shell utilities the script
    /// uses, and the user id `uid`.
    fn new(uid: u32) -> Self {
        let machine = Self {
            dir: tempfile::tempdir().expect("stub directory"),
        };
        for utility in ["cat", "sha256sum", "cut"] {
            let real = ["/usr/bin", "/bin"]
                .iter()
                .map(|dir| Path::new(dir).join(utility))
                .find(|path| path.exists())
                .expect("coreutils");
            std::os::unix::fs::symlink(real, machine.bin().join(utility)).expect("link");
        }
        machine.tool("id", &format!("echo {uid}"));
        machine.tool("cargo", "exit 0");
        machine.tool("apt-get", "echo 'apt-get must not run in --check' >&2; exit 99");
        machine
    }

    fn bin(&self) -> &Path {
        self.dir.path()
    }

    /// Adds an executable `name` that runs the shell `body`.
    fn tool(&self, name: &str, body: &str) -> PathBuf {
        let path = self.bin().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("stub");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        path
    }

    /// Node.js `version` with its npm.
    fn node(&self, version: &str) {
        self.tool("node", &format!("echo {version}"));
        self.tool("npm", "exit 0");
    }

    /// A Python 3 with or without its venv module.
    fn python(&self, venv: bool) {
        let import = if venv { 0 } else { 1 };
        self.tool(
            "python3",
            &format!("case \"$1\" in --version) echo 'Python 3.11.2';; -c) exit {import};; esac"),
        );
    }

    /// PostgreSQL binaries of `major` in a directory of their own, found
    /// through `KEEL_SETUP_PG_DIRS`.
    fn postgres(&self, major: u32) {
        let bin = self.dir.path().join(format!("pg/{major}/bin"));
        std::fs::create_dir_all(&bin).expect("pg dir");
        for name in ["initdb", "pg_ctl", "postgres"] {
            let path = bin.join(name);
            std::fs::write(&path, format!("#!/bin/sh\necho '{name} (PostgreSQL) {major}.4'\n")).expect("stub");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
    }

    /// Everything the tests need.
    fn complete(&self) {
        for tool in [
            "chromium",
            "mkfs.ext4",
            "chattr",
            "losetup",
            "mount",
            "systemd-analyze",
            "nginx",
            "caddy",
        ] {
            self.tool(tool, "exit 0");
        }
        self.postgres(16);
        self.python(true);
        self.node("v20.11.1");
    }

    /// `scripts/test ARGS` on this machine (nothing else on `PATH`).
    fn script(&self, args: &[&str]) -> Output {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test");
        Command::new("/bin/bash")
            .arg(script)
            .args(args)
            .env("PATH", self.bin())
            .env("KEEL_SETUP_PG_DIRS", format!("{}/pg/*/bin", self.bin().display()))
            .env("KEEL_SETUP_SBIN", "")
            .env("KEEL_SETUP_TOOLS", self.bin().join("unpacked"))
            .env_remove("KEEL_CHROMIUM")
            // What it would install whatever this clone has installed.
            .env("KEEL_SETUP_REINSTALL", "1")
            .output()
            .expect("run scripts/test")
    }

    fn check(&self, args: &[&str]) -> (bool, String) {
        let output = self.script(&[&["--check"], args].concat());
        (output.status.success(), text(&output))
    }
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The packages of the `apt-get install` the script would run, if any.
fn installs(out: &str) -> Option<Vec<String>> {
    let line = out.lines().find(|line| line.contains("apt-get install"))?;
    let packages = line.split("--no-install-recommends").nth(1)?;
    Some(packages.split_whitespace().map(str::to_owned).collect())
}

#[test]
fn a_bare_machine_as_root_gets_every_package_after_an_update_without_sudo() {
    let machine = Machine::new(0);
    machine.tool("sudo", "exit 0");
    let (ok, out) = machine.check(&[]);
    assert!(ok, "{out}");
    assert_eq!(
        installs(&out).expect("an install"),
        [
            "chromium",
            "postgresql",
            "e2fsprogs",
            "mount",
            "systemd",
            "python3",
            "python3-venv",
            "nodejs",
            "npm"
        ],
        "{out}"
    );
    let update = out.find("would run: apt-get update").expect("apt-get update first");
    assert!(update < out.find("apt-get install").expect("install"), "{out}");
    // The proxies' checkers are unpacked, not installed: an installed nginx
    // starts a server.
    assert!(
        out.contains("would run: apt-get download nginx caddy (unpacked with dpkg-deb -x into target/deploy-tools)"),
        "{out}"
    );
    assert!(!out.contains("sudo"), "root needs no sudo: {out}");
}

#[test]
fn a_user_installs_through_sudo_and_fails_clearly_without_it() {
    let machine = Machine::new(1000);
    machine.complete();
    std::fs::remove_file(machine.bin().join("chromium")).expect("no chromium");
    let without_sudo = machine.check(&[]);
    // Nothing is installed either way: the refusal comes before apt-get.
    let real = machine.script(&[]);
    machine.tool("sudo", "exit 0");
    let (ok, out) = machine.check(&[]);
    assert!(ok, "{out}");
    assert!(out.contains("would run: sudo apt-get update"), "{out}");
    assert_eq!(installs(&out).expect("an install"), ["chromium"], "{out}");
    assert!(
        out.contains("sudo env DEBIAN_FRONTEND=noninteractive apt-get install"),
        "{out}"
    );

    for (ok, out) in [without_sudo, (real.status.success(), text(&real))] {
        assert!(!ok, "{out}");
        assert!(out.contains("install chromium: run as root, or install sudo"), "{out}");
        assert!(!out.contains("apt-get must not run"), "{out}");
    }
}

#[test]
fn an_installed_node_is_never_replaced() {
    let machine = Machine::new(0);
    machine.node("v22.3.0");
    let (ok, out) = machine.check(&[]);
    assert!(ok, "{out}");
    assert!(out.contains("found Node.js v22.3.0"), "{out}");
    let packages = installs(&out).expect("an install");
    assert!(!packages.iter().any(|name| name == "nodejs" || name == "npm"), "{out}");

    // Too old, or without npm: said, not "fixed" by apt.
    machine.node("v18.19.0");
    let (ok, out) = machine.check(&[]);
    assert!(!ok, "{out}");
    assert!(out.contains("Node.js v18.19.0 is too old"), "{out}");
    assert!(
        !installs(&out).expect("an install").contains(&"nodejs".to_owned()),
        "{out}"
    );
    machine.node("v20.11.1");
    std::fs::remove_file(machine.bin().join("npm")).expect("no npm");
    let (ok, out) = machine.check(&[]);
    assert!(!ok, "{out}");
    assert!(out.contains("node is installed but npm is not"), "{out}");
    assert!(
        !installs(&out).expect("an install").contains(&"npm".to_owned()),
        "{out}"
    );
}

#[test]
fn a_complete_machine_installs_nothing_and_passes_the_arguments_to_cargo_test() {
    let machine = Machine::new(1000);
    machine.complete();
    let (ok, out) = machine.check(&["-p", "keel", "--test", "all", "examples"]);
    assert!(ok, "{out}");
    assert!(out.contains("nothing to install"), "{out}");
    assert!(
        !out.contains("apt-get update"),
        "no update when nothing is installed: {out}"
    );
    assert!(out.contains("found PostgreSQL 16"), "{out}");
    for step in [
        "would run: npm ci --prefix .ci/node",
        "--require-hashes -r .ci/python/requirements.txt",
        "would run: npm ci --prefix clients/typescript",
        "would run: cargo test -p keel --test all examples",
    ] {
        assert!(out.contains(step), "{step}: {out}");
    }
}

#[test]
fn an_old_postgres_or_a_python_without_venv_is_completed() {
    let machine = Machine::new(0);
    machine.complete();
    std::fs::remove_dir_all(machine.bin().join("pg")).expect("no pg 16");
    machine.postgres(14);
    machine.python(false);
    std::fs::remove_file(machine.bin().join("chattr")).expect("no chattr");
    let (ok, out) = machine.check(&[]);
    assert!(ok, "{out}");
    assert_eq!(
        installs(&out).expect("an install"),
        ["postgresql", "e2fsprogs", "python3-venv"],
        "{out}"
    );
}

#[test]
fn help_says_what_it_installs() {
    let output = Machine::new(0).script(&["--help"]);
    assert!(output.status.success(), "{}", text(&output));
    let out = text(&output);
    assert!(out.starts_with("usage: scripts/test"), "{out}");
    assert!(out.contains("--check") && out.contains("only when no node is"), "{out}");
}
