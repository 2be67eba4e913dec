//! Linux namespaces for a sandboxed command: its own PID namespace (so
//! nothing it starts outlives it, and Keel's processes are out of sight),
//! its own mount namespace (read-only everywhere but where the policy lets
//! it write, with Keel's secrets covered) and, unless the network is
//! allowed, its own network namespace (no interface but a loopback that is
//! down).
//!
//! The supervisor calls [`unshare`], so that its next child is created in
//! the new namespaces (as PID 1 of the new PID namespace), and sets the
//! mounts up with [`confine_mounts`]; the child, the only process that can
//! mount a `/proc` for the new PID namespace, calls [`mount_private_proc`].
//!
//! Creating namespaces needs `CAP_SYS_ADMIN`: Keel running as root has it;
//! otherwise the namespaces are created inside a new user namespace, where
//! the caller's user and group map to themselves. Where neither is allowed
//! (a container without `CAP_SYS_ADMIN` and with user namespaces filtered,
//! or a kernel with unprivileged user namespaces turned off), [`unshare`]
//! fails and the launcher falls back to Landlock, seccomp and a subreaper.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare as unshare_namespaces};
use nix::unistd::{getgid, getuid};

use super::private_mounts::{self, Dev, real_path};

/// The namespaces the supervisor entered for its child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Namespaces {
    /// Whether they live in a new user namespace (Keel is not root).
    pub(super) user: bool,
    /// Whether the child has a network namespace of its own (no network).
    pub(super) network: bool,
}

impl Namespaces {
    /// Their names, for the status line: `pid, mount, network, user`.
    pub(super) fn describe(self) -> String {
        let mut names = vec!["pid", "mount"];
        if self.network {
            names.push("network");
        }
        if self.user {
            names.push("user");
        }
        names.join(", ")
    }
}

/// Makes the calling process's *next child* start in new PID and mount
/// namespaces, and a new network namespace unless `network` is allowed.
/// Tries without a user namespace first (root), then with one. Must run
/// while the caller has a single thread (a user namespace requires it), and
/// the caller must not start threads afterwards (the kernel refuses to
/// share an address space across PID namespaces).
pub(super) fn unshare(network: bool) -> Result<Namespaces, String> {
    let mut flags = CloneFlags::CLONE_NEWPID | CloneFlags::CLONE_NEWNS;
    if !network {
        flags |= CloneFlags::CLONE_NEWNET;
    }
    match unshare_namespaces(flags) {
        Ok(()) => {
            return Ok(Namespaces {
                user: false,
                network: !network,
            });
        }
        Err(Errno::EPERM) => {}
        Err(error) => return Err(format!("cannot create namespaces: {error}")),
    }
    unshare_as_user(flags)?;
    Ok(Namespaces {
        user: true,
        network: !network,
    })
}

/// Enters `flags`' namespaces inside a new user namespace where the
/// caller's user and group map to themselves, so files keep their owner.
fn unshare_as_user(flags: CloneFlags) -> Result<(), String> {
    let (uid, gid) = (getuid(), getgid());
    unshare_namespaces(flags | CloneFlags::CLONE_NEWUSER)
        .map_err(|error| format!("cannot create namespaces, with or without a user namespace: {error}"))?;
    // `setgroups` must be denied before an unprivileged process may write
    // its gid map.
    match std::fs::write("/proc/self/setgroups", "deny") {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            return Err(format!("cannot deny setgroups in the user namespace: {error}"));
        }
        _ => {}
    }
    std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1\n"))
        .map_err(|error| format!("cannot map the user in the user namespace: {error}"))?;
    std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1\n"))
        .map_err(|error| format!("cannot map the group in the user namespace: {error}"))?;
    Ok(())
}

/// Moves the calling process itself into a new mount namespace (inside a
/// new user namespace unless it is root), for a command that keeps the
/// rest of the host ([`keep_apart`]). Must run while the caller has a
/// single thread.
pub(super) fn unshare_mounts() -> Result<(), String> {
    match unshare_namespaces(CloneFlags::CLONE_NEWNS) {
        Ok(()) => Ok(()),
        Err(Errno::EPERM) => unshare_as_user(CloneFlags::CLONE_NEWNS),
        Err(error) => Err(format!("cannot create a mount namespace: {error}")),
    }
}

/// Sets up the mount namespace of a command that is otherwise not
/// restricted (an MCP server Keel starts for a session): nothing propagates
/// back to the host, each of `private_roots` shows only `workspace`, and
/// every path of `hidden` that exists is covered. Everything else stays as
/// on the host, writable where it was. Returns how many roots were
/// covered. Any error means the command must not run.
pub(super) fn keep_apart(workspace: &Path, private_roots: &[PathBuf], hidden: &[PathBuf]) -> Result<usize, String> {
    make_mounts_private()?;
    let opened = private_mounts::Workspace::open(workspace)?;
    let mut covered = 0;
    for root in private_roots {
        if private_mounts::private_root(&opened, root)? {
            covered += 1;
        }
    }
    for path in hidden {
        cover(path)?;
    }
    Ok(covered)
}

/// What [`confine_mounts`] is to set up.
#[derive(Debug, Clone, Copy)]
pub(super) struct MountPlan<'a> {
    /// Whether the policy restricts the command (every policy but full
    /// access): then every mount but `writable` becomes read-only, `/dev`
    /// minimal and `/tmp` private.
    pub(super) restricted: bool,
    /// The workspace (which may lie under `/tmp`).
    pub(super) workspace: &'a Path,
    /// The places the command may write.
    pub(super) writable: &'a [PathBuf],
    /// Keel's protected paths, to cover.
    pub(super) hidden: &'a [PathBuf],
    /// Directories that may hold the database's Unix sockets, to cover.
    pub(super) sockets: &'a [PathBuf],
    /// Directories of workspaces: each is covered but for the workspace,
    /// bound back onto its own path when it lies there.
    pub(super) private_roots: &'a [PathBuf],
    /// The size of the private `/tmp` and `/dev/shm`, in bytes.
    pub(super) tmp_size: u64,
}

/// What [`confine_mounts`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct MountReport {
    /// Whether every mount outside the writable places is read-only.
    pub(super) read_only: bool,
    /// The protected paths that were covered.
    pub(super) hidden: usize,
    /// Whether `/dev` is the minimal one, and (then) whether it has a
    /// `pts` of its own.
    pub(super) dev: Option<Dev>,
    /// Whether `/tmp` is private to the call.
    pub(super) private_tmp: bool,
    /// The socket directories that were covered (or whose database
    /// sockets were, when the workspace lies in them).
    pub(super) sockets: Vec<PathBuf>,
    /// How many directories of workspaces were covered.
    pub(super) private_roots: usize,
}

/// Sets up the mount namespace the sandboxed command will share, from the
/// supervisor (which entered it with [`unshare`]), so that the paths to
/// cover never appear in a command line the command can read: nothing
/// propagates back to the host; when restricted, `/dev` becomes minimal and
/// `/tmp` private (see [`private_mounts`](super::private_mounts)), every
/// mount becomes read-only except the writable places (bound onto
/// themselves first, so they stay writable), and every hidden path and
/// socket directory that exists is covered (a file by `/dev/null`, a
/// directory by an empty read-only tmpfs). Any error means the command must
/// not run.
pub(super) fn confine_mounts(plan: &MountPlan<'_>) -> Result<MountReport, String> {
    make_mounts_private()?;
    let mut report = MountReport::default();
    if !plan.restricted {
        return Ok(report);
    }
    // Opened before `/tmp` is replaced, in case it lies there.
    let workspace = private_mounts::Workspace::open(plan.workspace)?;
    // First, since the covers below are bound from its `/dev/null`.
    report.dev = Some(private_mounts::minimal_dev(plan.tmp_size)?);
    report.private_tmp = private_mounts::private_tmp(&workspace, plan.tmp_size)?;
    // Before the writable places are bound: the workspace is among them,
    // and must be bound onto the path it is shown at.
    for root in plan.private_roots {
        if private_mounts::private_root(&workspace, root)? {
            report.private_roots += 1;
        }
    }
    for place in plan.writable {
        mount(
            Some(place),
            place,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(|error| format!("cannot bind {}: {error}", place.display()))?;
    }
    for path in plan.hidden {
        if cover(path)? {
            report.hidden += 1;
        }
    }
    let workspace = real_path(plan.workspace);
    for directory in plan.sockets {
        let directory = real_path(directory);
        let covered = if workspace.starts_with(&directory) {
            // Covering the directory would hide the workspace: cover the
            // database's sockets in it instead.
            cover_database_sockets(&directory)?
        } else {
            cover(&directory)?
        };
        if covered && !report.sockets.contains(&directory) {
            report.sockets.push(directory);
        }
    }
    remount_read_only(plan.writable)?;
    report.read_only = true;
    Ok(report)
}

/// Makes every mount of this namespace private, so that nothing done to
/// them propagates back to the host's.
fn make_mounts_private() -> Result<(), String> {
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|error| format!("cannot make the mounts private: {error}"))
}

/// Covers `path` if it exists: a directory by an empty read-only tmpfs,
/// anything else by `/dev/null`. Returns whether it existed.
fn cover(path: &Path) -> Result<bool, String> {
    match std::fs::metadata(path) {
        Ok(metadata) if metadata.is_dir() => mount(
            Some("tmpfs"),
            path,
            Some("tmpfs"),
            MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some("size=4k,mode=000"),
        ),
        Ok(_) => mount(Some("/dev/null"), path, None::<&str>, MsFlags::MS_BIND, None::<&str>),
        Err(_) => return Ok(false),
    }
    .map_err(|error| format!("cannot cover {}: {error}", path.display()))?;
    Ok(true)
}

/// Covers PostgreSQL's socket files (`.s.PGSQL.<port>` and their lock
/// files) in `directory`. Returns whether there were any.
fn cover_database_sockets(directory: &Path) -> Result<bool, String> {
    let Ok(entries) = std::fs::read_dir(directory) else {
        return Ok(false);
    };
    let mut any = false;
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(".s.PGSQL.") {
            any |= cover(&entry.path())?;
        }
    }
    Ok(any)
}

/// Mounts a `/proc` that shows only the caller's PID namespace (so Keel's
/// processes, their command lines and environments are out of sight); only
/// a process inside that namespace can. Returns whether it could: a kernel
/// may refuse because parts of the host's `/proc` are masked, which is
/// reported, not fatal (Keel is non-dumpable and the command has no
/// capabilities, so Keel's environment stays unreadable).
pub(super) fn mount_private_proc() -> bool {
    mount(
        Some("proc"),
        "/proc",
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .is_ok()
}

/// Remounts every mount of this namespace read-only, except the ones at or
/// under `writable`. Each keeps its other flags: inside a user namespace
/// the kernel refuses a remount that would drop `nosuid`, `nodev`, `noexec`
/// or the atime flags.
fn remount_read_only(writable: &[PathBuf]) -> Result<(), String> {
    let table =
        std::fs::read("/proc/self/mountinfo").map_err(|error| format!("cannot read the mount table: {error}"))?;
    for entry in parse_mountinfo(&table) {
        if writable.iter().any(|place| entry.mount_point.starts_with(place)) {
            continue;
        }
        let flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | entry.flags;
        match mount(None::<&str>, &entry.mount_point, None::<&str>, flags, None::<&str>) {
            Ok(()) => {}
            // A mount point that is gone or hidden under another mount (a
            // stacked mount), or one this process cannot reach: there is
            // nothing there the command could write through.
            // EINVAL: nothing is mounted there any more (a mount of the
            // host's `/dev` under the minimal one).
            Err(Errno::ENOENT | Errno::EACCES | Errno::EINVAL) => {}
            Err(error) => {
                return Err(format!(
                    "cannot make {} read-only: {error}",
                    entry.mount_point.display()
                ));
            }
        }
    }
    Ok(())
}

/// One line of `/proc/self/mountinfo`: where, and the per-mount flags that
/// a remount must keep.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MountEntry {
    mount_point: PathBuf,
    flags: MsFlags,
}

/// The entries of a mount table, parents before children as the kernel
/// lists them. Fields are separated by spaces; field 5 is the mount point
/// (with spaces, tabs, newlines and backslashes written as octal escapes)
/// and field 6 the per-mount options.
fn parse_mountinfo(table: &[u8]) -> Vec<MountEntry> {
    table
        .split(|byte| *byte == b'\n')
        .filter_map(|line| {
            let mut fields = line.split(|byte| *byte == b' ');
            let mount_point = fields.nth(4)?;
            let options = fields.next()?;
            Some(MountEntry {
                mount_point: PathBuf::from(OsString::from_vec(unescape(mount_point))),
                flags: mount_flags(options),
            })
        })
        .collect()
}

/// The flags among a mount's options that a bind remount must repeat.
fn mount_flags(options: &[u8]) -> MsFlags {
    options
        .split(|byte| *byte == b',')
        .fold(MsFlags::empty(), |flags, option| {
            flags
                | match option {
                    b"nosuid" => MsFlags::MS_NOSUID,
                    b"nodev" => MsFlags::MS_NODEV,
                    b"noexec" => MsFlags::MS_NOEXEC,
                    b"noatime" => MsFlags::MS_NOATIME,
                    b"nodiratime" => MsFlags::MS_NODIRATIME,
                    b"relatime" => MsFlags::MS_RELATIME,
                    b"strictatime" => MsFlags::MS_STRICTATIME,
                    _ => MsFlags::empty(),
                }
        })
}

/// Decodes the `\ooo` octal escapes of a mount table field.
pub(super) fn unescape(field: &[u8]) -> Vec<u8> {
    let mut decoded = Vec::with_capacity(field.len());
    let mut index = 0;
    while index < field.len() {
        let octal = field
            .get(index + 1..index + 4)
            .filter(|digits| field[index] == b'\\' && digits.iter().all(|digit| (b'0'..=b'7').contains(digit)));
        match octal {
            Some(digits) => {
                let value = digits
                    .iter()
                    .fold(0u32, |value, digit| value * 8 + u32::from(digit - b'0'));
                decoded.push(u8::try_from(value).unwrap_or(b'?'));
                index += 4;
            }
            None => {
                decoded.push(field[index]);
                index += 1;
            }
        }
    }
    decoded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_tables_parse_with_escapes_and_flags() {
        let table = b"22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n\
                      30 1 8:1 / /mnt/with\\040space ro,noatime - ext4 /dev/sda1 rw\n\
                      garbage\n";
        let entries = parse_mountinfo(table);
        assert_eq!(
            entries,
            [
                MountEntry {
                    mount_point: PathBuf::from("/proc"),
                    flags: MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC | MsFlags::MS_RELATIME,
                },
                MountEntry {
                    mount_point: PathBuf::from("/mnt/with space"),
                    flags: MsFlags::MS_NOATIME,
                },
            ]
        );
        assert_eq!(unescape(b"a\\134b\\011"), b"a\\b\t");
        assert_eq!(unescape(b"trailing\\"), b"trailing\\");
        assert_eq!(unescape(b"\\9xx"), b"\\9xx");
    }

    #[test]
    fn namespaces_describe_themselves() {
        let all = Namespaces {
            user: true,
            network: true,
        };
        assert_eq!(all.describe(), "pid, mount, network, user");
        let root = Namespaces {
            user: false,
            network: false,
        };
        assert_eq!(root.describe(), "pid, mount");
    }
}
