//! The Landlock ruleset of a sandboxed command: what it may write, and,
//! unless the network is allowed, no TCP (and, on kernels that can, no UDP
//! and no Unix socket files outside its writable places), no abstract Unix
//! sockets and no signals to processes outside its sandbox.
//!
//! The ruleset asks for every feature this crate knows, best effort: a
//! kernel with an older Landlock enforces what it has, and [`Applied`]
//! says which ABI applied and so which features were enforced.

use std::path::Path;

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, LandlockStatus, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope,
};

use super::{SandboxError, SandboxPolicy};

/// The file-system rights the rules are written for (Linux 6.10: every
/// write right including `refer`, `truncate` and device ioctls).
const FS_ABI: ABI = ABI::V5;

/// What the kernel enforced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Applied {
    /// The kernel has no usable Landlock; the text says why.
    Unavailable(String),
    /// The ruleset is in force.
    Enforced {
        /// The kernel's Landlock ABI version.
        abi: i32,
        /// Whether every file-system right of [`FS_ABI`] is restricted (an
        /// older kernel leaves some kinds of write unrestricted).
        all_writes: bool,
        /// The features beyond the file system: `tcp`, `udp`,
        /// `unix socket files`, `abstract unix sockets`, `signals`.
        features: Vec<&'static str>,
    },
}

impl Applied {
    /// Whether the file-system policy is enforced.
    pub(super) fn enforced(&self) -> bool {
        matches!(self, Self::Enforced { .. })
    }

    /// A short description for the status line.
    pub(super) fn describe(&self) -> String {
        match self {
            Self::Unavailable(reason) => reason.clone(),
            Self::Enforced {
                abi,
                all_writes,
                features,
            } => {
                let mut text = format!("landlock ABI v{abi}");
                if !all_writes {
                    text.push_str(" (older than v5: some kinds of write are not restricted)");
                }
                if !features.is_empty() {
                    text.push_str(" with ");
                    text.push_str(&features.join(", "));
                }
                text
            }
        }
    }
}

/// Applies `policy` (not full access) to the calling thread and everything
/// it executes, irreversibly. `writable` are the places the policy lets the
/// command write; `devices` the device files (or directories of them) it
/// may write and control besides `/dev/null` (the minimal `/dev`'s
/// terminals, which are the command's own); `network` whether it may use
/// the network.
pub(super) fn restrict_self(
    policy: SandboxPolicy,
    writable: &[&Path],
    devices: &[&Path],
    network: bool,
    reads: Option<&[&Path]>,
) -> Result<Applied, SandboxError> {
    let ruleset = build(policy, writable, devices, network, reads)?;
    let status = ruleset
        .restrict_self()
        .map_err(|error| SandboxError::Landlock(error.to_string()))?;
    Ok(match (status.ruleset, status.landlock) {
        (RulesetStatus::NotEnforced, landlock) => Applied::Unavailable(unavailable_reason(landlock)),
        (_, LandlockStatus::Available { effective_abi, .. }) => Applied::Enforced {
            abi: effective_abi as i32,
            all_writes: effective_abi >= FS_ABI,
            features: features(effective_abi, network),
        },
        (_, landlock) => Applied::Unavailable(unavailable_reason(landlock)),
    })
}

/// Whether the kernel can enforce `policy`'s file-system rules, found by
/// building the ruleset (without any writable place) and dropping it: the
/// caller is not restricted.
pub(super) fn can_enforce(policy: SandboxPolicy) -> Result<(), String> {
    match build(policy, &[], &[], true, None).map(Option::<std::os::fd::OwnedFd>::from) {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err("landlock unavailable on this kernel".into()),
        Err(error) => Err(format!("landlock refused the ruleset: {error}")),
    }
}

/// The features beyond the file system that `abi` enforces when the
/// network is not allowed (signals are scoped either way).
fn features(abi: ABI, network: bool) -> Vec<&'static str> {
    let mut features = Vec::new();
    if !network {
        if abi >= ABI::V4 {
            features.push("tcp");
        }
        if abi >= ABI::V10 {
            features.push("udp");
        }
        if abi >= ABI::V9 {
            features.push("unix socket files");
        }
        if abi >= ABI::V6 {
            features.push("abstract unix sockets");
        }
    }
    if abi >= ABI::V6 {
        features.push("signals");
    }
    features
}

/// Why Landlock did not restrict anything.
pub(super) fn unavailable_reason(landlock: LandlockStatus) -> String {
    match landlock {
        LandlockStatus::NotEnabled => "landlock unavailable (built in but not enabled at boot)".into(),
        LandlockStatus::NotImplemented => "landlock unavailable (not built into this kernel)".into(),
        LandlockStatus::Available { .. } => "landlock did not apply the rules".into(),
    }
}

/// The system directories a command may read and run from when reads are
/// narrowed (see [`super::SandboxReads`]), where they exist.
pub(super) const SYSTEM_DIRECTORIES: [&str; 14] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/nix", "/proc", "/sys", "/dev",
    "/run",
];

/// The ruleset: read and execute everywhere (or only under `reads`), write in `writable` and
/// `/dev/null`; without the network, no TCP or UDP ports, no Unix socket
/// files but in `writable`, no abstract Unix sockets from outside; no
/// signals to processes outside the sandbox. Best effort: what the
/// running kernel's Landlock lacks is left out, and the status of
/// [`restrict_self`] says which ABI applied.
fn build(
    policy: SandboxPolicy,
    writable: &[&Path],
    devices: &[&Path],
    network: bool,
    reads: Option<&[&Path]>,
) -> Result<RulesetCreated, SandboxError> {
    let landlock = |error: landlock::RulesetError| SandboxError::Landlock(error.to_string());
    let mut handled = AccessFs::from_all(FS_ABI);
    if !network {
        // From ABI v9, connecting to a Unix socket file is a right of its
        // own, granted only where writing is.
        handled |= AccessFs::ResolveUnix;
    }
    let read = AccessFs::from_read(FS_ABI);
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(handled)
        .map_err(landlock)?;
    if !network {
        // Handled with no rule allowing any port: no TCP (from v4) and no
        // UDP (from v10) at all.
        ruleset = ruleset.handle_access(AccessNet::from_all(ABI::V10)).map_err(landlock)?;
    }
    let scopes = if network {
        Scope::Signal.into()
    } else {
        Scope::from_all(ABI::V6)
    };
    ruleset = ruleset.scope(scopes).map_err(landlock)?;
    let mut ruleset = ruleset.create().map_err(landlock)?;
    match reads {
        None => ruleset = ruleset.add_rule(PathBeneath::new(open("/")?, read)).map_err(landlock)?,
        Some(places) => {
            // Those that do not exist (no /nix here) are left out.
            for place in places {
                if let Ok(fd) = PathFd::new(place) {
                    ruleset = ruleset.add_rule(PathBeneath::new(fd, read)).map_err(landlock)?;
                }
            }
        }
    }
    // Discarding output (`> /dev/null`) must keep working, even read-only.
    for device in std::iter::once(Path::new("/dev/null")).chain(devices.iter().copied()) {
        if let Ok(fd) = PathFd::new(device) {
            let access = if device.is_dir() {
                AccessFs::from_file(FS_ABI) | AccessFs::from_read(FS_ABI)
            } else {
                AccessFs::from_file(FS_ABI)
            };
            ruleset = ruleset.add_rule(PathBeneath::new(fd, access)).map_err(landlock)?;
        }
    }
    if policy == SandboxPolicy::WorkspaceWrite {
        for place in writable {
            let fd = PathFd::new(place).map_err(|error| SandboxError::Workspace {
                path: place.display().to_string(),
                message: error.to_string(),
            })?;
            ruleset = ruleset.add_rule(PathBeneath::new(fd, handled)).map_err(landlock)?;
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
    fn features_follow_the_abi_and_the_network() {
        assert_eq!(features(ABI::V1, false), Vec::<&str>::new());
        assert_eq!(features(ABI::V4, false), ["tcp"]);
        assert_eq!(features(ABI::V7, false), ["tcp", "abstract unix sockets", "signals"]);
        assert_eq!(features(ABI::V7, true), ["signals"]);
        assert_eq!(
            features(ABI::V10, false),
            ["tcp", "udp", "unix socket files", "abstract unix sockets", "signals"]
        );
    }

    #[test]
    fn descriptions_name_the_abi_and_what_is_missing() {
        let applied = Applied::Enforced {
            abi: 3,
            all_writes: false,
            features: vec![],
        };
        assert_eq!(
            applied.describe(),
            "landlock ABI v3 (older than v5: some kinds of write are not restricted)"
        );
        let applied = Applied::Enforced {
            abi: 7,
            all_writes: true,
            features: vec!["tcp", "signals"],
        };
        assert_eq!(applied.describe(), "landlock ABI v7 with tcp, signals");
        assert!(!Applied::Unavailable("x".into()).enforced());
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
