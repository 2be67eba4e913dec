//! The file systems a restricted command gets of its own, set up by the
//! supervisor in the command's mount namespace: a minimal `/dev` (as
//! bubblewrap's `--dev` makes it) and a fresh `/tmp`.
//!
//! The host's `/dev` holds the raw block devices: a command running as
//! root, even without a capability, may open them as their owner and read
//! every file of a file system, Keel's covered ones included (`debugfs`).
//! The minimal `/dev` holds only `null`, `zero`, `full`, `random`,
//! `urandom` and `tty` (bound from the host's), a `pts` of its own (a new
//! devpts instance, with `ptmx`), a private `shm`, and the `fd`, `stdin`,
//! `stdout` and `stderr` links.
//!
//! The host's `/tmp` is shared by every process of the machine: other
//! sessions' workspaces when the workspace root is there, other programs'
//! files and sockets (PostgreSQL's `.s.PGSQL.*`). Each call gets an empty,
//! size-limited tmpfs instead; a workspace under `/tmp` is opened before
//! and bound back onto its own path in the new one.

use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::mount::{MsFlags, mount};

/// The device nodes bound from the host's `/dev`.
const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// The links of the minimal `/dev`: name and target.
const LINKS: [(&str, &str); 5] = [
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
    ("ptmx", "pts/ptmx"),
];

/// A path opened without being read (`O_PATH`), to bind it elsewhere
/// once its own path is covered.
fn open_path(path: &Path, directory: bool) -> Result<File, String> {
    let mut flags = nix::libc::O_PATH | nix::libc::O_CLOEXEC;
    if directory {
        flags |= nix::libc::O_DIRECTORY;
    }
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|error| format!("cannot open {}: {error}", path.display()))
}

/// The path through which an opened file can be bound.
fn fd_path(file: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(file)))
}

fn bind(source: &Path, target: &Path) -> Result<(), String> {
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|error| format!("cannot bind {}: {error}", target.display()))
}

fn tmpfs(target: &str, options: &str, flags: MsFlags) -> Result<(), String> {
    mount(Some("tmpfs"), target, Some("tmpfs"), flags, Some(options))
        .map_err(|error| format!("cannot mount a tmpfs on {target}: {error}"))
}

/// What [`minimal_dev`] made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Dev {
    /// Whether `/dev/pts` is a devpts of the command's own (a kernel may
    /// refuse one; the command then has no terminals).
    pub(super) pts: bool,
}

/// Replaces `/dev` (in this mount namespace) by a minimal one whose `shm`
/// holds at most `shm_size` bytes. Keel's covered files, which are bound
/// from `/dev/null`, must be covered after this.
pub(super) fn minimal_dev(shm_size: u64) -> Result<Dev, String> {
    let hosts: Vec<(&str, File)> = DEVICES
        .iter()
        .filter_map(|name| Some((*name, open_path(&Path::new("/dev").join(name), false).ok()?)))
        .collect();
    tmpfs("/dev", "mode=0755,size=64k", MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC)?;
    for (name, host) in &hosts {
        let node = Path::new("/dev").join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o666)
            .open(&node)
            .map_err(|error| format!("cannot create {}: {error}", node.display()))?;
        bind(&fd_path(host), &node)?;
    }
    for (name, target) in LINKS {
        std::os::unix::fs::symlink(target, Path::new("/dev").join(name))
            .map_err(|error| format!("cannot create /dev/{name}: {error}"))?;
    }
    let mut directories = std::fs::DirBuilder::new();
    directories.mode(0o755);
    for name in ["pts", "shm"] {
        directories
            .create(Path::new("/dev").join(name))
            .map_err(|error| format!("cannot create /dev/{name}: {error}"))?;
    }
    let pts = mount(
        Some("devpts"),
        "/dev/pts",
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=620"),
    )
    .is_ok();
    tmpfs(
        "/dev/shm",
        &format!("mode=1777,size={shm_size}"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
    )?;
    Ok(Dev { pts })
}

/// The workspace, opened before `/tmp` is replaced when it lies there.
#[derive(Debug)]
pub(super) struct Workspace {
    path: PathBuf,
    opened: File,
}

impl Workspace {
    /// Opens `path` (made real) as a directory.
    pub(super) fn open(path: &Path) -> Result<Self, String> {
        let path = real_path(path);
        let opened = open_path(&path, true)?;
        Ok(Self { path, opened })
    }
}

/// Mounts an empty tmpfs of `size` bytes on `/tmp` and, when `workspace`
/// lies under `/tmp`, binds it back onto its own path there (the
/// directories above it are created empty in the new `/tmp`). Returns
/// whether `/tmp` is private: not when it is the workspace itself.
pub(super) fn private_tmp(workspace: &Workspace, size: u64) -> Result<bool, String> {
    let tmp = Path::new("/tmp");
    if real_path(tmp) != tmp {
        // `/tmp` is a link elsewhere: the tmpfs would go there.
        return Err("/tmp is not a directory of its own".into());
    }
    tmpfs(
        "/tmp",
        &format!("mode=1777,size={size}"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
    )?;
    if workspace.path == tmp {
        bind(&fd_path(&workspace.opened), tmp)?;
        return Ok(false);
    }
    if workspace.path.starts_with(tmp) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&workspace.path)
            .map_err(|error| format!("cannot recreate the workspace in the private /tmp: {error}"))?;
        bind(&fd_path(&workspace.opened), &workspace.path)?;
    }
    Ok(true)
}

/// Covers `root`, a directory of workspaces, with an empty tmpfs and, when
/// `workspace` lies under it, binds the workspace back onto its own path
/// there (the directories between are made empty, so no other workspace's
/// name shows). The tmpfs becomes read-only with every other mount. Returns
/// whether `root` existed. The workspace *is* the root (a session told to
/// work in it) leaves it as it is: nothing else is to hide from it.
pub(super) fn private_root(workspace: &Workspace, root: &Path) -> Result<bool, String> {
    let root = real_path(root);
    // `/` as a root of workspaces would cover the system itself: left as
    // it is (the sandbox's other walls still stand).
    if !root.is_dir() || root == Path::new("/") || workspace.path == root || root.starts_with(&workspace.path) {
        return Ok(false);
    }
    let shown = root
        .to_str()
        .ok_or_else(|| format!("the workspace root {} is not UTF-8", root.display()))?;
    tmpfs(shown, "mode=0755,size=64k", MsFlags::MS_NOSUID | MsFlags::MS_NODEV)?;
    if workspace.path.starts_with(&root) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&workspace.path)
            .map_err(|error| format!("cannot recreate the workspace under its root: {error}"))?;
        bind(&fd_path(&workspace.opened), &workspace.path)?;
    }
    Ok(true)
}

/// `path` made absolute and free of symbolic links where it exists, so
/// that it can be compared with the mount table's entries.
pub(super) fn real_path(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}
