//! The `shell` tool's sandbox: which parts of the file system a command may
//! change, enforced by the kernel with Landlock where it can be.
//!
//! Landlock restricts the *calling* thread and everything it executes
//! afterwards, irreversibly. Keel must not restrict itself, and it may not
//! run code between `fork` and `exec` (that needs `unsafe`, which the crate
//! forbids). So the shell runs each command through a launcher, the hidden
//! `keel sandbox-exec` subcommand (see [`launcher_arguments`]): a fresh
//! process that applies the ruleset to itself with
//! [`restrict_current_process`], reports what it achieved on stderr (one
//! line, see [`status_report_line`]), and then runs the command as its
//! child, which inherits the restriction; it waits for it, kills the call's
//! process group if Keel dies meanwhile, and ends as the command ended.
//!
//! What each [`SandboxPolicy`] allows:
//!
//! | policy | read and execute | write |
//! |---|---|---|
//! | `read-only` | everywhere | only `/dev/null` |
//! | `workspace-write` | everywhere | the workspace, the temporary directory (`/tmp`), `/dev/null` |
//! | `full-access` | everywhere | everywhere (no ruleset at all) |
//!
//! "Write" covers creating, changing, truncating, renaming and removing
//! files and directories. The sandbox is about the file system only: it does
//! not restrict the network, signals or other processes. Applying it also
//! sets `no_new_privs`, so set-user-ID programs (`sudo`) gain nothing.
//!
//! Where the kernel has no Landlock, the command still runs, unrestricted,
//! and the status says `not enforced` so the runtime can record it; a kernel
//! with an older Landlock enforces what it can (`partially enforced`). A
//! launcher that fails to apply the rules for any other reason refuses to
//! run the command (exit code 126).

use std::ffi::{OsStr, OsString};
use std::path::Path;

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, LandlockStatus, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, RulesetStatus,
};
use serde::{Deserialize, Serialize};

/// What the shell's commands may change.
///
/// Serialized in kebab case (`"read-only"`, `"workspace-write"`,
/// `"full-access"`), the same spelling the launcher's `--policy` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
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

/// Whether a policy is (or can be) enforced, and how.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxStatus {
    /// The policy asked for.
    pub policy: SandboxPolicy,
    /// Whether the kernel restricts the command as the policy says (fully
    /// or, on an older kernel, partially; `detail` tells which). Always
    /// false for [`SandboxPolicy::FullAccess`], which restricts nothing.
    pub enforced: bool,
    /// A short explanation, for people and the model.
    pub detail: String,
}

impl SandboxStatus {
    /// The status as the first line of a shell result, for example
    /// `[sandbox: workspace-write, not enforced: landlock unavailable (not built into this kernel)]`.
    pub fn line(&self) -> String {
        let enforced = if self.enforced { "enforced" } else { "not enforced" };
        format!("[sandbox: {}, {enforced}: {}]", self.policy, self.detail)
    }

    /// The status in a line written by [`SandboxStatus::line`] (such as the
    /// first line of a `shell` result), so the runtime can record it.
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
        })
    }

    fn unrestricted(policy: SandboxPolicy, detail: impl Into<String>) -> Self {
        Self {
            policy,
            enforced: false,
            detail: detail.into(),
        }
    }
}

impl From<&SandboxStatus> for crate::protocol::SandboxInfo {
    fn from(status: &SandboxStatus) -> Self {
        Self {
            policy: status.policy.to_string(),
            enforced: status.enforced,
            detail: status.detail.clone(),
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
}

/// The subcommand of the `keel` binary that launches a sandboxed command.
pub const LAUNCHER_SUBCOMMAND: &str = "sandbox-exec";

/// The Landlock ABI the rules are written for (Linux 6.10: every write
/// right including `refer`, `truncate` and device ioctls). Newer ABIs only
/// add rights this policy does not need; on older kernels the rights they
/// lack are left unrestricted and the status says `partially enforced`.
const TARGET_ABI: ABI = ABI::V5;

/// How the launcher tells the shell tool what it achieved: the first line
/// it writes to stderr is this marker, the status as JSON, and a newline.
/// The marker starts with an ASCII record separator so no ordinary output
/// is mistaken for it.
const STATUS_MARKER: &str = "\u{1e}keel-sandbox-status ";

/// The arguments to give the launcher binary (`keel`) so that it runs
/// `program` with `arguments` under `policy`, with `workspace` writable
/// when the policy allows it.
pub fn launcher_arguments(
    policy: SandboxPolicy,
    workspace: &Path,
    program: &OsStr,
    arguments: &[&OsStr],
) -> Vec<OsString> {
    let mut all: Vec<OsString> = vec![
        LAUNCHER_SUBCOMMAND.into(),
        "--policy".into(),
        policy.as_str().into(),
        "--workspace".into(),
        workspace.as_os_str().to_os_string(),
        "--".into(),
        program.to_os_string(),
    ];
    all.extend(arguments.iter().map(|argument| argument.to_os_string()));
    all
}

/// The line the launcher writes to stderr before it runs the command.
pub fn status_report_line(status: &SandboxStatus) -> String {
    // Serializing a struct of strings and a bool cannot fail.
    let json = serde_json::to_string(status).unwrap_or_default();
    format!("{STATUS_MARKER}{json}\n")
}

/// The status in `line` (without its newline), if it is a launcher's
/// report.
pub fn parse_status_report(line: &[u8]) -> Option<SandboxStatus> {
    let json = line.strip_prefix(STATUS_MARKER.as_bytes())?;
    serde_json::from_slice(json).ok()
}

/// Whether the running kernel can enforce `policy`, found by building the
/// ruleset (without any workspace rule) and dropping it: the calling process
/// is not restricted.
pub fn probe(policy: SandboxPolicy) -> SandboxStatus {
    if policy == SandboxPolicy::FullAccess {
        return SandboxStatus::unrestricted(policy, "the policy restricts nothing");
    }
    let created = |level| build_ruleset(policy, None, level).map(Option::<std::os::fd::OwnedFd>::from);
    match created(CompatLevel::HardRequirement) {
        Ok(Some(_)) => SandboxStatus {
            policy,
            enforced: true,
            detail: format!("landlock can enforce it (ABI v{TARGET_ABI} or later)"),
        },
        _ => match created(CompatLevel::BestEffort) {
            Ok(Some(_)) => SandboxStatus {
                policy,
                enforced: true,
                detail: format!(
                    "landlock can enforce it partially: this kernel's landlock is older than ABI v{TARGET_ABI}, \
                     so some kinds of write are not restricted"
                ),
            },
            Ok(None) => SandboxStatus::unrestricted(policy, "landlock unavailable on this kernel"),
            Err(error) => SandboxStatus::unrestricted(policy, format!("landlock refused the ruleset: {error}")),
        },
    }
}

/// Applies `policy` to the calling thread, irreversibly, and to every
/// program it executes from then on. Only for a launcher that is about to
/// `exec` the sandboxed command from this same thread, before it has
/// started any other thread (Landlock restricts the calling thread only).
///
/// A kernel without Landlock is not an error: the status says the policy is
/// not enforced. An error means the rules could not be applied; the caller
/// must not run the command then.
pub fn restrict_current_process(policy: SandboxPolicy, workspace: &Path) -> Result<SandboxStatus, SandboxError> {
    if policy == SandboxPolicy::FullAccess {
        return Ok(SandboxStatus::unrestricted(policy, "the policy restricts nothing"));
    }
    let ruleset = build_ruleset(policy, Some(workspace), CompatLevel::BestEffort)?;
    let status = ruleset
        .restrict_self()
        .map_err(|error| SandboxError::Landlock(error.to_string()))?;
    let abi = match status.landlock {
        LandlockStatus::Available { effective_abi, .. } => format!("landlock ABI v{effective_abi}"),
        _ => "landlock".to_string(),
    };
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => SandboxStatus {
            policy,
            enforced: true,
            detail: abi,
        },
        RulesetStatus::PartiallyEnforced => SandboxStatus {
            policy,
            enforced: true,
            detail: format!("{abi}, partially: this kernel cannot restrict every kind of write"),
        },
        RulesetStatus::NotEnforced => SandboxStatus::unrestricted(policy, unavailable_reason(status.landlock)),
    })
}

/// Why Landlock did not restrict anything.
fn unavailable_reason(landlock: LandlockStatus) -> String {
    match landlock {
        LandlockStatus::NotEnabled => "landlock unavailable (built in but not enabled at boot)".into(),
        LandlockStatus::NotImplemented => "landlock unavailable (not built into this kernel)".into(),
        LandlockStatus::Available { .. } => "landlock did not apply the rules".into(),
    }
}

/// The ruleset for `policy` (not [`SandboxPolicy::FullAccess`]): read and
/// execute everywhere, write where the policy allows. Without a workspace
/// (a probe) the workspace rule is left out.
fn build_ruleset(
    policy: SandboxPolicy,
    workspace: Option<&Path>,
    level: CompatLevel,
) -> Result<RulesetCreated, SandboxError> {
    let landlock = |error: landlock::RulesetError| SandboxError::Landlock(error.to_string());
    let read = AccessFs::from_read(TARGET_ABI);
    let all = AccessFs::from_all(TARGET_ABI);
    let mut ruleset = Ruleset::default()
        .set_compatibility(level)
        .handle_access(all)
        .map_err(landlock)?
        .create()
        .map_err(landlock)?
        .add_rule(PathBeneath::new(open("/")?, read))
        .map_err(landlock)?;
    // Discarding output (`> /dev/null`) must keep working, even read-only.
    if let Ok(null) = PathFd::new("/dev/null") {
        ruleset = ruleset
            .add_rule(PathBeneath::new(null, AccessFs::from_file(TARGET_ABI)))
            .map_err(landlock)?;
    }
    if policy == SandboxPolicy::WorkspaceWrite {
        if let Some(workspace) = workspace {
            let fd = PathFd::new(workspace).map_err(|error| SandboxError::Workspace {
                path: workspace.display().to_string(),
                message: error.to_string(),
            })?;
            ruleset = ruleset.add_rule(PathBeneath::new(fd, all)).map_err(landlock)?;
        }
        // Compilers and many tools need scratch space.
        if let Ok(temporary) = PathFd::new(std::env::temp_dir()) {
            ruleset = ruleset.add_rule(PathBeneath::new(temporary, all)).map_err(landlock)?;
        }
    }
    Ok(ruleset)
}

fn open(path: &str) -> Result<PathFd, SandboxError> {
    PathFd::new(path).map_err(|error| SandboxError::Landlock(format!("cannot open {path}: {error}")))
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
            detail: "landlock ABI v6".into(),
        };
        assert_eq!(enforced.line(), "[sandbox: read-only, enforced: landlock ABI v6]");
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
            serde_json::json!({"policy": "read-only", "enforced": true, "detail": "landlock ABI v6"})
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
        let arguments = launcher_arguments(
            SandboxPolicy::ReadOnly,
            Path::new("/w s"),
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
                assert!(status.detail.starts_with("landlock can enforce it"), "{status:?}");
            } else {
                assert_eq!(status.detail, "landlock unavailable on this kernel", "{status:?}");
            }
        }
        // Whatever the kernel said, this process can still write.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("still-writable"), "yes").unwrap();
    }

    #[test]
    fn unavailable_reasons_name_the_cause() {
        assert_eq!(
            unavailable_reason(LandlockStatus::NotImplemented),
            "landlock unavailable (not built into this kernel)"
        );
        assert_eq!(
            unavailable_reason(LandlockStatus::NotEnabled),
            "landlock unavailable (built in but not enabled at boot)"
        );
    }
}
