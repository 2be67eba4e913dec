//! What a sandboxed command finds of the machine's shared places: the
//! host's `/dev` (raw block devices, which a command running as root may
//! read around every covered file) and the host's `/tmp` (other sessions'
//! workspaces, other programs' files and sockets). Real loop devices, the
//! real `keel` binary.

use std::path::{Path, PathBuf};
use std::process::Command;

use keel::tools::workspace::sandbox::{self, SandboxPolicy};

use crate::suite::support::process::keel_binary_for;
use crate::suite::support::sandbox::{chown_to, keel_run, outside_scratch, run, shell, shell_script};
use crate::suite::support::skip;

/// Makes a missing loop device or root a failure instead of a skip.
const REQUIRE: &str = "KEEL_REQUIRE_FAULT_TESTS";

/// What the minimal `/dev` holds, as `ls /dev` lists it.
const MINIMAL_DEV: &str = "fd\nfull\nnull\nptmx\npts\nrandom\nshm\nstderr\nstdin\nstdout\ntty\nurandom\nzero\n";

/// An ext4 file system on a loop device, mounted at a directory outside
/// the temporary directory; unmounted (and the device freed) when dropped.
struct LoopMount {
    point: tempfile::TempDir,
    device: String,
    _image: tempfile::TempDir,
}

impl LoopMount {
    fn new() -> Result<Self, String> {
        if !nix::unistd::geteuid().is_root() {
            return Err("not root: cannot set up a loop device".into());
        }
        let image_dir = tempfile::tempdir().map_err(|error| error.to_string())?;
        let image = image_dir.path().join("fs.img");
        std::fs::File::create(&image)
            .and_then(|file| file.set_len(16 << 20))
            .map_err(|error| error.to_string())?;
        command("mkfs.ext4", &["-q".as_ref(), image.as_os_str()])?;
        let point = outside_scratch();
        command(
            "mount",
            &[
                "-o".as_ref(),
                "loop".as_ref(),
                image.as_os_str(),
                point.path().as_os_str(),
            ],
        )?;
        let source = Command::new("findmnt")
            .args(["-n", "-o", "SOURCE"])
            .arg(point.path())
            .output()
            .map_err(|error| format!("cannot run findmnt: {error}"))?;
        let device = String::from_utf8_lossy(&source.stdout).trim().to_owned();
        let mount = Self {
            point,
            device,
            _image: image_dir,
        };
        if !mount.device.starts_with("/dev/loop") {
            return Err(format!("no loop device for the image: {:?}", mount.device));
        }
        Ok(mount)
    }
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.point.path()).status();
        // `mount -o loop` frees the device on unmount; this is for a
        // kernel that does not.
        let _ = Command::new("losetup").args(["-d", &self.device]).output();
    }
}

/// Runs a command; its stderr on failure.
fn command(program: &str, args: &[&std::ffi::OsStr]) -> Result<String, String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|error| format!("cannot run {program}: {error}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

#[tokio::test]
async fn a_root_command_reads_no_protected_file_through_the_block_device() {
    let test = "a_root_command_reads_no_protected_file_through_the_block_device";
    let mount = match LoopMount::new() {
        Ok(mount) => mount,
        Err(why) if skip::may_skip(REQUIRE) => {
            skip::announce(test, &format!("{why} (set {REQUIRE}=1 to make this a failure)"));
            return;
        }
        Err(why) => panic!("{test} cannot run: {why}"),
    };
    let canary = format!("token-canary-{}", uuid::Uuid::now_v7().simple());
    let secret = mount.point.path().join("secret");
    std::fs::write(&secret, &canary).expect("secret");
    sandbox::protect(&secret);
    let _ = Command::new("sync").status();
    // Outside the sandbox, the raw device gives the file away.
    let outside = command(
        "debugfs",
        &["-R".as_ref(), "cat /secret".as_ref(), mount.device.as_ref()],
    )
    .expect("debugfs outside the sandbox");
    assert!(
        outside.contains(&canary),
        "debugfs cannot read the file, so the test proves nothing: {outside}"
    );
    let workspace = tempfile::tempdir().expect("workspace");
    let attack = format!(
        "cat '{}'; debugfs -R 'cat /secret' {} 2>&1; ls -l {} 2>&1; echo done",
        secret.display(),
        mount.device,
        mount.device
    );
    for policy in [SandboxPolicy::ReadOnly, SandboxPolicy::WorkspaceWrite] {
        let output = run(&shell(policy, false), workspace.path(), &attack).await;
        assert!(output.contains("done"), "{policy}: {output}");
        assert!(
            !output.contains(&canary),
            "{policy}: the command read the protected file: {output}"
        );
        assert!(output.contains("minimal /dev"), "{policy}: {output}");
        let listed = run(&shell(policy, false), workspace.path(), "ls /dev").await;
        assert!(
            listed.contains(&format!("[stdout]\n{MINIMAL_DEV}")),
            "{policy}: {listed}"
        );
    }
}

#[tokio::test]
async fn the_minimal_dev_still_works_for_ordinary_commands() {
    let workspace = tempfile::tempdir().expect("workspace");
    let output = run(
        &shell(SandboxPolicy::WorkspaceWrite, false),
        workspace.path(),
        "echo gone > /dev/null && head -c 4 /dev/zero | wc -c && head -c 8 /dev/urandom | wc -c && \
         echo shm > /dev/shm/x && cat /dev/shm/x && ls /dev/fd/ >/dev/null && echo fds && \
         /usr/bin/python3 -c 'import os, pty; m, s = pty.openpty(); print(\"pty\", os.ttyname(s).startswith(\"/dev/pts/\"))'",
    )
    .await;
    assert!(output.contains("[stdout]\n4\n8\nshm\nfds\npty True\n"), "{output}");
}

#[test]
fn a_command_of_an_unprivileged_keel_sees_the_minimal_dev() {
    let dir = tempfile::tempdir().expect("dir");
    let uid = nix::unistd::geteuid().is_root().then_some(65534);
    let binary = keel_binary_for(uid, dir.path());
    std::fs::write(dir.path().join("s.jsonl"), shell_script(&["ls /dev"])).expect("script");
    if let Some(uid) = uid {
        chown_to(dir.path(), uid);
    }
    let results = keel_run(&binary, dir.path(), &dir.path().join("keel.sqlite3"), uid, &[]);
    assert!(
        results[0].contains(&format!("[stdout]\n{MINIMAL_DEV}")),
        "{}",
        results[0]
    );
    assert!(results[0].contains("minimal /dev"), "{}", results[0]);
}

/// Everything under `dir`, as paths relative to it, with what each is.
fn tree(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut all = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).expect("read_dir").flatten() {
            let path = entry.path();
            let kind = entry.file_type().expect("type");
            let what = if kind.is_symlink() {
                "link".to_owned()
            } else if kind.is_dir() {
                pending.push(path.clone());
                "dir".to_owned()
            } else {
                std::fs::read_to_string(&path).unwrap_or_default()
            };
            all.push((path.strip_prefix(dir).expect("under dir").to_path_buf(), what));
        }
    }
    all.sort();
    all
}

#[tokio::test]
async fn a_command_cannot_touch_another_workspace_under_a_root_in_tmp() {
    // Two sessions' workspaces under one root in the temporary directory.
    let root = tempfile::tempdir().expect("root");
    assert!(root.path().starts_with(std::env::temp_dir()));
    let (first, second) = (root.path().join("first"), root.path().join("second"));
    std::fs::create_dir_all(second.join("src")).expect("second");
    std::fs::create_dir(&first).expect("first");
    std::fs::write(second.join("src/main.rs"), "fn main() {}\n").expect("file");
    let before = tree(root.path());
    // A file of another program in /tmp.
    let other = tempfile::NamedTempFile::new().expect("other file");
    let marker = format!("keel-private-tmp-{}", uuid::Uuid::now_v7().simple());
    let attack = format!(
        "echo x > ../second/new; echo y > ../second/src/main.rs; mkdir ../second/dir; rm -rf ../second/src; \
         mv ../second ../moved; ln -s / ../second-link; touch ../third; \
         test -e '{other}' && echo saw-other; echo mine > /tmp/{marker} && echo tmp-written; \
         echo kept > inside.txt",
        other = other.path().display()
    );
    let tool = shell(SandboxPolicy::WorkspaceWrite, false);
    let output = run(&tool, &first, &attack).await;
    assert!(
        output.contains("tmp-written"),
        "/tmp is writable under workspace-write: {output}"
    );
    assert!(
        !output.contains("saw-other"),
        "the command saw another program's file in /tmp: {output}"
    );
    assert!(output.contains("private /tmp"), "{output}");
    let mut expected = before;
    expected.push((PathBuf::from("first/inside.txt"), "kept\n".into()));
    expected.sort();
    assert_eq!(tree(root.path()), expected, "{output}");
    // What the command wrote in /tmp went with the call.
    assert!(!std::env::temp_dir().join(&marker).exists(), "{output}");
    let again = run(&tool, &first, &format!("cat /tmp/{marker} 2>&1; echo checked")).await;
    assert!(again.contains("No such file") && again.contains("checked"), "{again}");
}
