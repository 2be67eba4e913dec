//! The `shell` tool's sandbox: what a command may change, whether it may
//! use the network, what of Keel it may see, and that nothing it starts
//! outlives it; enforced by the kernel.
//!
//! Keel must not restrict itself, and it may not run code between `fork`
//! and `exec` (that needs `unsafe`, which the crate denies). So the shell
//! runs each command through a launcher, the hidden `keel sandbox-exec`
//! subcommand (see [`launcher_arguments`]), in two processes:
//!
//! 1. the *supervisor* ([`launcher::supervise`]) creates the namespaces the
//!    command will live in (PID and mount, and network unless the network
//!    is allowed; inside a user namespace when Keel is not root) and starts
//!    the second process in them. It stays outside, out of the command's
//!    reach: it waits for the command, kills it when Keel dies or asks it
//!    to stop (`SIGTERM`), and ends as the command ended;
//! 2. the *confiner* ([`launcher::confine_and_exec`]), PID 1 of the new PID
//!    namespace, makes every mount read-only but the places the policy lets
//!    the command write, covers Keel's protected files (its database, token
//!    file and configuration, see [`protect`]), mounts a `/proc` that shows
//!    only the command's processes, drops every capability, applies
//!    Landlock and (without the network) a seccomp filter, reports what it
//!    achieved on stderr (one line, see [`status_report_line`]) and becomes
//!    the command. When it ends, the kernel kills every process left in
//!    its PID namespace: no descendant outlives the call, `setsid` and
//!    double forks included.
//!
//! What each [`SandboxPolicy`] allows:
//!
//! | policy | read and execute | write | devices, `/tmp`, database socket | network |
//! |---|---|---|---|---|
//! | `read-only` | everywhere but Keel's protected files and other workspaces | only `/dev/null` | minimal `/dev`, private `/tmp` (read-only), socket covered | only if allowed |
//! | `workspace-write` | everywhere but Keel's protected files and other workspaces | the workspace, the call's private `/tmp` and `/dev/shm`, `/dev/null` | minimal `/dev`, private `/tmp`, socket covered | only if allowed |
//! | `full-access` | everywhere | everywhere | the host's | yes |
//!
//! "Write" covers creating, changing, truncating, renaming and removing
//! files and directories, and changing their metadata (mode, owner, times,
//! extended attributes): a read-only mount refuses all of them. Every
//! policy, `full-access` included, runs the command in its own PID
//! namespace, so nothing it starts outlives the call or Keel, and under the
//! call's resource [`Limits`] (a cgroup where the machine allows one, and
//! rlimits, see [`limits`]). The minimal `/dev` and the private `/tmp` are
//! `private_mounts` module's; the launcher is always started from
//! [`launcher::SELF_EXE`], never from a path a command could replace, and
//! a call whose launcher does not report the sandbox fails without output.
//!
//! Where namespaces cannot be created (a container without
//! `CAP_SYS_ADMIN` that also filters user namespaces), the launcher falls
//! back to Landlock for the file system and TCP, seccomp for every other
//! socket, and a subreaper supervisor that kills every descendant; the
//! status then says that metadata changes, Keel's protected files, the
//! host's `/dev` and `/tmp` and database sockets are not covered. Where the kernel has no Landlock either, the file-system
//! policy is not enforced and the status says `not enforced`. A launcher
//! that fails to apply what it can for any other reason refuses to run the
//! command (exit code 126).

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

pub mod apart;
mod init;
mod landlock;
pub mod launcher;
pub mod limits;
mod namespaces;
mod private_mounts;
mod privileges;
mod reaper;
mod seccomp;

pub use self::limits::Limits;

/// What the shell's commands may change.
///
/// Serialized in kebab case (`"read-only"`, `"workspace-write"`,
/// `"full-access"`), the same spelling the launcher's `--policy` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum SandboxPolicy {
    /// Read and execute anything; write nothing (but `/dev/null`).
    ReadOnly,
    /// Also write under the workspace and the temporary directory.
    #[default]
    WorkspaceWrite,
    /// No restriction.
    FullAccess,
}

impl SandboxPolicy {
    /// The policy's name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadOnly => "read-only",
            Self::WorkspaceWrite => "workspace-write",
            Self::FullAccess => "full-access",
        }
    }

    /// How permissive the policy is: read-only < workspace-write <
    /// full-access, for comparing a request with a ceiling.
    pub fn rank(self) -> u8 {
        match self {
            Self::ReadOnly => 0,
            Self::WorkspaceWrite => 1,
            Self::FullAccess => 2,
        }
    }
}

impl std::fmt::Display for SandboxPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for SandboxPolicy {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "read-only" => Ok(Self::ReadOnly),
            "workspace-write" => Ok(Self::WorkspaceWrite),
            "full-access" => Ok(Self::FullAccess),
            other => Err(format!(
                "unknown sandbox policy '{other}' (expected read-only, workspace-write or full-access)"
            )),
        }
    }
}

/// What a restricted command may read (and run), besides what it may write.
///
/// Serialized `"anywhere"` (the default) or `"workspace"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxReads {
    /// Everywhere but Keel's protected files and the other workspaces.
    #[default]
    Anywhere,
    /// Only its workspace, its private `/tmp`, and the system directories
    /// (`/usr`, `/bin`, `/lib*`, `/etc`, `/opt`, `/nix`, `/proc`, `/sys`,
    /// `/dev`, `/run`): the users' home directories and other projects are
    /// out of reach (by Landlock, so also without namespaces).
    Workspace,
}

static NARROW_READS: AtomicBool = AtomicBool::new(false);

/// Sets what every restricted command of this process may read (the
/// operator's `[server] sandbox_reads`).
pub fn set_reads(reads: SandboxReads) {
    NARROW_READS.store(reads == SandboxReads::Workspace, Ordering::Relaxed);
}

/// What restricted commands of this process may read.
pub fn reads() -> SandboxReads {
    if NARROW_READS.load(Ordering::Relaxed) {
        SandboxReads::Workspace
    } else {
        SandboxReads::Anywhere
    }
}

/// Whether a policy is (or can be) enforced, and how.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxStatus {
    /// The policy asked for.
    pub policy: SandboxPolicy,
    /// Whether the kernel restricts what the command may write as the
    /// policy says (by read-only mounts, Landlock, or both; `detail` tells
    /// which). Always false for [`SandboxPolicy::FullAccess`], which
    /// restricts nothing.
    pub enforced: bool,
    /// A short explanation, for people and the model.
    pub detail: String,
    /// Whether the command is kept off the network.
    #[serde(default)]
    pub network_blocked: bool,
}

impl SandboxStatus {
    /// The status as the first line of a shell result, for example
    /// `[sandbox: workspace-write, not enforced: landlock unavailable (not built into this kernel)]`.
    pub fn line(&self) -> String {
        let enforced = if self.enforced { "enforced" } else { "not enforced" };
        format!("[sandbox: {}, {enforced}: {}]", self.policy, self.detail)
    }

    /// The status in a line written by [`SandboxStatus::line`] (such as the
    /// first line of a `shell` result), so the runtime can record it. The
    /// line does not say whether the network was blocked beyond `detail`.
    pub fn from_line(line: &str) -> Option<Self> {
        let inner = line.trim_end().strip_prefix("[sandbox: ")?.strip_suffix(']')?;
        let (policy, rest) = inner.split_once(", ")?;
        let (enforced, detail) = if let Some(detail) = rest.strip_prefix("enforced: ") {
            (true, detail)
        } else {
            (false, rest.strip_prefix("not enforced: ")?)
        };
        Some(Self {
            policy: policy.parse().ok()?,
            enforced,
            detail: detail.to_string(),
            network_blocked: detail.contains(NETWORK_BLOCKED),
        })
    }

    /// A status for commands that run without restriction.
    pub fn unrestricted(policy: SandboxPolicy, detail: impl Into<String>) -> Self {
        Self {
            policy,
            enforced: false,
            detail: detail.into(),
            network_blocked: false,
        }
    }
}

/// How the detail of a status says that the network is blocked.
const NETWORK_BLOCKED: &str = "network blocked";

impl From<&SandboxStatus> for keel_protocol::SandboxInfo {
    fn from(status: &SandboxStatus) -> Self {
        Self {
            policy: status.policy.to_string(),
            enforced: status.enforced,
            detail: status.detail.clone(),
            network_blocked: status.network_blocked,
        }
    }
}

/// Why the sandbox could not be applied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// The workspace directory cannot be opened; retrying will not help
    /// until it exists.
    #[error("cannot open the workspace {path}: {message}")]
    Workspace {
        /// The workspace as given.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// Landlock refused the ruleset.
    #[error("landlock: {0}")]
    Landlock(String),
    /// Another step of the confinement failed (namespaces, mounts,
    /// capabilities, seccomp); the text says which.
    #[error("{0}")]
    Confinement(String),
}

/// The subcommand of the `keel` binary that launches a sandboxed command.
pub const LAUNCHER_SUBCOMMAND: &str = "sandbox-exec";

/// How the launcher tells the shell tool what it achieved: the first line
/// it writes to stderr is this marker, the status as JSON, and a newline.
/// The marker starts with an ASCII record separator so no ordinary output
/// is mistaken for it.
const STATUS_MARKER: &str = "\u{1e}keel-sandbox-status ";

// The registry of protected files lives in `tools::protected`, shared with
// the file tools; it is re-exported here, where its callers know it.
pub use crate::protected::{protect, protect_all, protected_paths};

/// What the launcher is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchOptions<'a> {
    /// The policy.
    pub policy: SandboxPolicy,
    /// The workspace, writable under workspace-write.
    pub workspace: &'a Path,
    /// Whether the command may use the network.
    pub network: bool,
    /// Paths the command may not see (see [`protect`]).
    pub protected: &'a [PathBuf],
    /// Directories that may hold the database's Unix sockets, covered
    /// besides the usual ones (see [`cover_socket_directory`]).
    pub sockets: &'a [PathBuf],
    /// Directories of workspaces, of which the command sees only its own
    /// (see [`keep_workspaces_apart`]).
    pub private_roots: &'a [PathBuf],
    /// What the command may read (see [`SandboxReads`]).
    pub reads: SandboxReads,
    /// The call's resource limits.
    pub limits: Limits,
}

/// The arguments to give the launcher binary (`keel`) so that it runs
/// `program` with `arguments` as `options` say.
pub fn launcher_arguments(options: &LaunchOptions<'_>, program: &OsStr, arguments: &[&OsStr]) -> Vec<OsString> {
    let mut all: Vec<OsString> = vec![LAUNCHER_SUBCOMMAND.into()];
    all.extend(option_arguments(options));
    all.push("--".into());
    all.push(program.to_os_string());
    all.extend(arguments.iter().map(|argument| argument.to_os_string()));
    all
}

/// The options as launcher flags (shared by both stages of the launcher).
fn option_arguments(options: &LaunchOptions<'_>) -> Vec<OsString> {
    let mut all: Vec<OsString> = vec![
        "--policy".into(),
        options.policy.as_str().into(),
        "--workspace".into(),
        options.workspace.as_os_str().to_os_string(),
    ];
    if options.network {
        all.push("--network".into());
    }
    for path in options.protected {
        all.push("--protect".into());
        all.push(path.as_os_str().to_os_string());
    }
    for path in options.sockets {
        all.push("--cover-sockets".into());
        all.push(path.as_os_str().to_os_string());
    }
    for path in options.private_roots {
        all.push("--private-root".into());
        all.push(path.as_os_str().to_os_string());
    }
    if options.reads == SandboxReads::Workspace {
        all.push("--reads".into());
        all.push("workspace".into());
    }
    all.extend(options.limits.arguments());
    all
}

/// The launcher flag that restricts nothing but the walls between
/// sessions (see [`apart_arguments`]).
pub const APART_FLAG: &str = "--apart-only";

/// The arguments to give the launcher binary so that it runs `program` with
/// `arguments` restricted only by the walls between sessions: under each
/// directory of workspaces ([`keep_workspaces_apart`]) only `workspace`
/// shows, and Keel's protected paths ([`protect`]) are covered. For what
/// Keel starts for a session outside the shell's sandbox (MCP servers),
/// which needs the host as it is (the network, a home directory's caches)
/// but has no business with another session's files or Keel's own. `None`
/// when nothing is registered to keep apart.
pub fn apart_arguments(workspace: &Path, program: &OsStr, arguments: &[OsString]) -> Option<Vec<OsString>> {
    let (roots, protected) = (private_roots(), protected_paths());
    if roots.is_empty() && protected.is_empty() {
        return None;
    }
    let mut all: Vec<OsString> = vec![
        LAUNCHER_SUBCOMMAND.into(),
        APART_FLAG.into(),
        "--workspace".into(),
        workspace.as_os_str().to_os_string(),
    ];
    for path in &protected {
        all.push("--protect".into());
        all.push(path.as_os_str().to_os_string());
    }
    for path in &roots {
        all.push("--private-root".into());
        all.push(path.as_os_str().to_os_string());
    }
    all.push("--".into());
    all.push(program.to_os_string());
    all.extend(arguments.iter().cloned());
    Some(all)
}

/// Where PostgreSQL puts its Unix sockets when told nothing else (Debian
/// and most packages; `/tmp`, the upstream default, is private to each
/// call anyway): covered in every restricted sandbox.
pub const USUAL_SOCKET_DIRECTORIES: [&str; 2] = ["/run/postgresql", "/var/run/postgresql"];

/// Socket directories registered with [`cover_socket_directory`].
static SOCKET_DIRECTORIES: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Marks `directory` as one that holds the Unix socket of Keel's database
/// (a PostgreSQL server's): every restricted sandbox covers it, so that no
/// command connects to the database, whatever its local authentication.
/// A read-only mount does not stop `connect()` on a socket file, and
/// Landlock restricts Unix sockets only from ABI 9.
pub fn cover_socket_directory(directory: &Path) {
    let directory = std::path::absolute(directory).unwrap_or_else(|_| directory.to_path_buf());
    if let Ok(mut directories) = SOCKET_DIRECTORIES.lock()
        && !directories.contains(&directory)
    {
        directories.push(directory);
    }
}

/// The directories registered with [`cover_socket_directory`].
pub fn socket_directories() -> Vec<PathBuf> {
    SOCKET_DIRECTORIES
        .lock()
        .map(|directories| directories.clone())
        .unwrap_or_default()
}

/// Directories registered with [`keep_workspaces_apart`].
static PRIVATE_ROOTS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Marks `root` as a directory of workspaces (`keel serve`'s
/// `--workspace-root`, which holds every tenant's sessions): a restricted
/// command sees under it only its own workspace, the rest covered by an
/// empty read-only file system, so one session's command (prompt-injected
/// or not) cannot list or read another's files, another tenant's included.
/// A command whose workspace is elsewhere sees nothing under it.
pub fn keep_workspaces_apart(root: &Path) {
    let root = std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf());
    if let Ok(mut roots) = PRIVATE_ROOTS.lock()
        && !roots.contains(&root)
    {
        roots.push(root);
    }
}

/// The directories registered with [`keep_workspaces_apart`].
pub fn private_roots() -> Vec<PathBuf> {
    PRIVATE_ROOTS.lock().map(|roots| roots.clone()).unwrap_or_default()
}

/// The line the launcher writes to stderr before it runs the command.
pub fn status_report_line(status: &SandboxStatus) -> String {
    // Serializing a struct of strings and bools cannot fail.
    let json = serde_json::to_string(status).unwrap_or_default();
    format!("{STATUS_MARKER}{json}\n")
}

/// The status in `line` (without its newline), if it is a launcher's
/// report.
pub fn parse_status_report(line: &[u8]) -> Option<SandboxStatus> {
    let json = line.strip_prefix(STATUS_MARKER.as_bytes())?;
    serde_json::from_slice(json).ok()
}

/// Whether this kernel's Landlock can enforce `policy`'s file-system rules,
/// found without restricting the caller. The launcher may enforce more
/// (namespaces, seccomp); its report on each command is what applied.
pub fn probe(policy: SandboxPolicy) -> SandboxStatus {
    if policy == SandboxPolicy::FullAccess {
        return SandboxStatus::unrestricted(policy, "the policy restricts nothing");
    }
    match landlock::can_enforce(policy) {
        Ok(()) => SandboxStatus {
            policy,
            enforced: true,
            detail: "landlock can enforce it".into(),
            network_blocked: false,
        },
        Err(reason) => SandboxStatus::unrestricted(policy, reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_have_one_spelling() {
        for policy in [
            SandboxPolicy::ReadOnly,
            SandboxPolicy::WorkspaceWrite,
            SandboxPolicy::FullAccess,
        ] {
            let json = serde_json::to_string(&policy).unwrap();
            assert_eq!(json, format!("\"{}\"", policy.as_str()));
            assert_eq!(policy.as_str().parse::<SandboxPolicy>(), Ok(policy));
            assert_eq!(serde_json::from_str::<SandboxPolicy>(&json).unwrap(), policy);
        }
        assert_eq!(
            "rw".parse::<SandboxPolicy>(),
            Err("unknown sandbox policy 'rw' (expected read-only, workspace-write or full-access)".into())
        );
        assert_eq!(SandboxPolicy::default(), SandboxPolicy::WorkspaceWrite);
    }

    #[test]
    fn status_lines_say_both_ways() {
        let enforced = SandboxStatus {
            policy: SandboxPolicy::ReadOnly,
            enforced: true,
            detail: "landlock ABI v6; network blocked".into(),
            network_blocked: true,
        };
        assert_eq!(
            enforced.line(),
            "[sandbox: read-only, enforced: landlock ABI v6; network blocked]"
        );
        let not_enforced = SandboxStatus::unrestricted(SandboxPolicy::WorkspaceWrite, "landlock unavailable");
        assert_eq!(
            not_enforced.line(),
            "[sandbox: workspace-write, not enforced: landlock unavailable]"
        );
        for status in [&enforced, &not_enforced] {
            assert_eq!(SandboxStatus::from_line(&status.line()).as_ref(), Some(status));
        }
        assert_eq!(SandboxStatus::from_line("[exit code 0]"), None);
        assert_eq!(SandboxStatus::from_line("[sandbox: sideways, enforced: x]"), None);
        assert_eq!(
            serde_json::to_value(&enforced).unwrap(),
            serde_json::json!({"policy": "read-only", "enforced": true, "detail": "landlock ABI v6; network blocked", "network_blocked": true})
        );
    }

    #[test]
    fn status_reports_round_trip() {
        for status in [
            SandboxStatus::unrestricted(
                SandboxPolicy::ReadOnly,
                "landlock unavailable (not built into this kernel)",
            ),
            SandboxStatus {
                policy: SandboxPolicy::WorkspaceWrite,
                enforced: true,
                detail: "landlock ABI v5".into(),
                network_blocked: false,
            },
        ] {
            let line = status_report_line(&status);
            assert!(line.ends_with('\n'));
            assert_eq!(parse_status_report(line.trim_end().as_bytes()), Some(status));
        }
        assert_eq!(parse_status_report(b"{\"policy\": \"read-only\"}"), None);
        assert_eq!(parse_status_report(b"ordinary stderr"), None);
    }

    #[test]
    fn launcher_arguments_put_the_command_after_a_separator() {
        let protected = [PathBuf::from("/data/keel.sqlite3")];
        let options = LaunchOptions {
            policy: SandboxPolicy::ReadOnly,
            workspace: Path::new("/w s"),
            network: true,
            protected: &protected,
            sockets: &[PathBuf::from("/srv/pg")],
            private_roots: &[PathBuf::from("/srv/ws")],
            reads: SandboxReads::Workspace,
            limits: Limits::default(),
        };
        let arguments = launcher_arguments(
            &options,
            OsStr::new("sh"),
            &[OsStr::new("-c"), OsStr::new("echo --policy")],
        );
        assert_eq!(
            arguments,
            [
                "sandbox-exec",
                "--policy",
                "read-only",
                "--workspace",
                "/w s",
                "--network",
                "--protect",
                "/data/keel.sqlite3",
                "--cover-sockets",
                "/srv/pg",
                "--private-root",
                "/srv/ws",
                "--reads",
                "workspace",
                "--max-processes",
                "512",
                "--max-memory",
                "2147483648",
                "--max-file-size",
                "8589934592",
                "--tmp-size",
                "1073741824",
                "--",
                "sh",
                "-c",
                "echo --policy"
            ]
            .map(OsString::from)
        );
    }

    #[test]
    fn probing_does_not_restrict_the_caller() {
        assert_eq!(
            probe(SandboxPolicy::FullAccess),
            SandboxStatus::unrestricted(SandboxPolicy::FullAccess, "the policy restricts nothing")
        );
        for policy in [SandboxPolicy::ReadOnly, SandboxPolicy::WorkspaceWrite] {
            let status = probe(policy);
            assert_eq!(status.policy, policy);
            assert!(!status.detail.is_empty());
            if status.enforced {
                assert_eq!(status.detail, "landlock can enforce it", "{status:?}");
            } else {
                assert!(status.detail.starts_with("landlock "), "{status:?}");
            }
        }
        // Whatever the kernel said, this process can still write.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("still-writable"), "yes").unwrap();
    }

    #[test]
    fn policies_are_ranked_by_what_they_allow() {
        assert!(SandboxPolicy::ReadOnly.rank() < SandboxPolicy::WorkspaceWrite.rank());
        assert!(SandboxPolicy::WorkspaceWrite.rank() < SandboxPolicy::FullAccess.rank());
    }
}
