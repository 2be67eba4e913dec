//! Per-call resource limits of a sandboxed command: how many processes it
//! may run at once, how much memory it may use, how much CPU time each of
//! its processes may take, how large a file it may write, and no core
//! dumps.
//!
//! Two mechanisms, each where the machine allows it:
//!
//! - a *cgroup per call* (v2 where this process's cgroup delegates the
//!   `pids` and `memory` controllers, otherwise the v1 `pids` and `memory`
//!   hierarchies), created by the supervisor before it enters the command's
//!   namespaces and removed after the call. It counts every process of the
//!   call together, and it is the only process limit that holds against a
//!   command running as root (the kernel exempts uid 0 from
//!   `RLIMIT_NPROC`);
//! - *rlimits*, always, set by the confiner on itself before it starts the
//!   command: `RLIMIT_NPROC` (not for root, whom it does not bind),
//!   `RLIMIT_DATA` (per process, the memory limit), `RLIMIT_CPU` (per
//!   process), `RLIMIT_FSIZE` and `RLIMIT_CORE` = 0.
//!
//! The cgroup's files are opened before the supervisor's mounts become
//! read-only (and before it leaves the host's mount namespace), so that it
//! can still move processes and remove the cgroup through them while the
//! command sees the cgroup file systems read-only.

use std::ffi::OsString;
use std::fs::File;
use std::io::Write as _;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::unistd::{UnlinkatFlags, geteuid, getpid, unlinkat};

/// The limits of one shell call. Part of the shell's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most processes (and threads, as the kernel counts them) the call
    /// may run at once.
    pub processes: u32,
    /// The most memory, in bytes, the call may use (all its processes
    /// together, where a cgroup applies; each process, by `RLIMIT_DATA`).
    pub memory: u64,
    /// The most CPU time each process may use; `None` ties it to the
    /// call's timeout.
    pub cpu_time: Option<Duration>,
    /// The largest file, in bytes, a command may write.
    pub file_size: u64,
    /// The size, in bytes, of the call's private `/tmp` (and of its
    /// `/dev/shm`).
    pub tmp_size: u64,
}

impl Default for Limits {
    /// 512 processes, 2 GiB of memory, CPU time tied to the timeout, files
    /// up to 8 GiB, a `/tmp` of 1 GiB.
    fn default() -> Self {
        Self {
            processes: 512,
            memory: 2 << 30,
            cpu_time: None,
            file_size: 8 << 30,
            tmp_size: 1 << 30,
        }
    }
}

impl Limits {
    /// The limits as launcher flags, with the CPU time `cpu` when the
    /// limits do not set one.
    pub(super) fn arguments(&self) -> Vec<OsString> {
        let mut all: Vec<OsString> = vec![
            "--max-processes".into(),
            self.processes.to_string().into(),
            "--max-memory".into(),
            self.memory.to_string().into(),
            "--max-file-size".into(),
            self.file_size.to_string().into(),
            "--tmp-size".into(),
            self.tmp_size.to_string().into(),
        ];
        if let Some(cpu) = self.cpu_time {
            all.push("--max-cpu-secs".into());
            all.push(cpu.as_secs().max(1).to_string().into());
        }
        all
    }

    /// These limits with the CPU time tied to `timeout` when none is set:
    /// a little more than the timeout, so that the timeout (which kills
    /// every process of the call) normally comes first.
    pub fn for_timeout(self, timeout: Duration) -> Self {
        Self {
            cpu_time: Some(self.cpu_time.unwrap_or(timeout + Duration::from_secs(1))),
            ..self
        }
    }
}

/// Which cgroup version holds the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// cgroup v1 hierarchies (`pids`, `memory`).
    V1,
    /// The cgroup v2 hierarchy.
    V2,
}

impl CgroupVersion {
    /// The launcher's spelling (`v1`, `v2`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1 => "v1",
            Self::V2 => "v2",
        }
    }
}

impl std::str::FromStr for CgroupVersion {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "v1" => Ok(Self::V1),
            "v2" => Ok(Self::V2),
            other => Err(format!("unknown cgroup version '{other}' (expected v1 or v2)")),
        }
    }
}

/// What the cgroup of a call limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupLimits {
    /// Which version.
    pub version: CgroupVersion,
    /// Whether the number of processes is limited.
    pub pids: bool,
    /// Whether memory is limited.
    pub memory: bool,
}

impl CgroupLimits {
    /// These limits as the confiner's `--cgroup` flag: `v1,pids,memory`.
    pub fn flag(self) -> String {
        let mut parts = vec![self.version.as_str()];
        if self.pids {
            parts.push("pids");
        }
        if self.memory {
            parts.push("memory");
        }
        parts.join(",")
    }

    /// The limits of a `--cgroup` flag, as the supervisor writes it.
    pub fn parse_flag(flag: &str) -> Result<Self, String> {
        let mut parts = flag.split(',');
        let version: CgroupVersion = parts.next().unwrap_or_default().parse()?;
        let rest: Vec<&str> = parts.collect();
        Ok(Self {
            version,
            pids: rest.contains(&"pids"),
            memory: rest.contains(&"memory"),
        })
    }
}

/// One cgroup of the call, in one hierarchy.
#[derive(Debug)]
struct Group {
    /// The directory holding it (opened before the mounts changed).
    parent: File,
    /// Its name in `parent`.
    name: String,
    /// Its `cgroup.procs`, to move the supervisor in.
    enter: File,
    /// The supervisor's own cgroup's `cgroup.procs`, to move it back.
    leave: File,
}

/// The cgroups of one call (one per v1 hierarchy, or one in v2).
#[derive(Debug)]
pub(super) struct Cgroup {
    groups: Vec<Group>,
    limits: CgroupLimits,
}

/// The prefix of every call's cgroup, so that ones left behind by a
/// supervisor that was killed are found and removed by the next.
const GROUP_PREFIX: &str = "keel-sandbox-";

impl Cgroup {
    /// Creates the call's cgroup with `limits`, where the machine lets this
    /// process: `Err` says why not (the call then has rlimits only).
    pub(super) fn create(limits: &Limits) -> Result<Self, String> {
        let table = std::fs::read("/proc/self/mountinfo").map_err(|error| format!("cannot read mounts: {error}"))?;
        let own =
            std::fs::read_to_string("/proc/self/cgroup").map_err(|error| format!("cannot read cgroup: {error}"))?;
        let mounts = cgroup_mounts(&table);
        let name = format!(
            "{GROUP_PREFIX}{}-{}",
            getpid(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.as_nanos())
        );
        let v2 = mounts
            .iter()
            .find(|mount| mount.version == CgroupVersion::V2)
            .and_then(|mount| Some((mount, own_path(&own, None)?)))
            .and_then(|(mount, path)| Some(mount.point.join(mount.relative(&path)?)))
            .filter(|dir| delegates(dir));
        if let Some(dir) = v2 {
            let group = Group::create(&dir, &name, &[("pids.max", limits.processes.into())], |group| {
                group.write("memory.max", limits.memory)?;
                // Without swap, memory over the limit cannot go there either.
                let _ = group.write("memory.swap.max", 0);
                Ok(())
            })?;
            return Ok(Self {
                groups: vec![group],
                limits: CgroupLimits {
                    version: CgroupVersion::V2,
                    pids: true,
                    memory: true,
                },
            });
        }
        let mut cgroup = Self {
            groups: Vec::new(),
            limits: CgroupLimits {
                version: CgroupVersion::V1,
                pids: false,
                memory: false,
            },
        };
        let mut reasons = Vec::new();
        for controller in ["pids", "memory"] {
            let dir = mounts
                .iter()
                .find(|mount| mount.version == CgroupVersion::V1 && mount.controllers.iter().any(|c| c == controller))
                .and_then(|mount| Some((mount, own_path(&own, Some(controller))?)))
                .and_then(|(mount, path)| Some(mount.point.join(mount.relative(&path)?)));
            let Some(dir) = dir else {
                reasons.push(format!("no {controller} controller"));
                continue;
            };
            let created = if controller == "pids" {
                Group::create(&dir, &name, &[("pids.max", limits.processes.into())], |_| Ok(()))
            } else {
                Group::create(&dir, &name, &[("memory.limit_in_bytes", limits.memory)], |group| {
                    // Only where swap is accounted; it must not be below the
                    // memory limit.
                    let _ = group.write("memory.memsw.limit_in_bytes", limits.memory);
                    Ok(())
                })
            };
            match created {
                Ok(group) => {
                    if controller == "pids" {
                        cgroup.limits.pids = true;
                    } else {
                        cgroup.limits.memory = true;
                    }
                    cgroup.groups.push(group);
                }
                Err(reason) => reasons.push(reason),
            }
        }
        if cgroup.groups.is_empty() {
            return Err(reasons.join("; "));
        }
        Ok(cgroup)
    }

    /// What it limits.
    pub(super) fn limits(&self) -> CgroupLimits {
        self.limits
    }

    /// Moves this process into the cgroup, so that the next child is born
    /// in it (and cannot fork before it is counted).
    pub(super) fn enter(&mut self) -> Result<(), String> {
        for group in &mut self.groups {
            group
                .enter
                .write_all(b"0\n")
                .map_err(|error| format!("cannot join the cgroup {}: {error}", group.name))?;
        }
        Ok(())
    }

    /// Moves this process back to its own cgroup.
    pub(super) fn leave(&mut self) {
        for group in &mut self.groups {
            let _ = group.leave.write_all(b"0\n");
        }
    }

    /// Removes the cgroup once its processes are gone (the kernel may take
    /// a moment to let go of a group whose last process just ended).
    pub(super) fn remove(mut self) {
        self.leave();
        for group in &self.groups {
            for attempt in 0..200 {
                match unlinkat(&group.parent, group.name.as_str(), UnlinkatFlags::RemoveDir) {
                    Ok(()) | Err(nix::errno::Errno::ENOENT) => break,
                    Err(error) if attempt == 199 => {
                        tracing::warn!(%error, group = %group.name, "cannot remove a sandbox cgroup");
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        }
    }
}

impl Group {
    /// Creates cgroup `name` under `dir`, writes `limits` into it, then runs
    /// `more` on it; on any failure removes it again.
    fn create(
        dir: &Path,
        name: &str,
        limits: &[(&str, u64)],
        more: impl FnOnce(&Group) -> Result<(), String>,
    ) -> Result<Self, String> {
        sweep(dir);
        let path = dir.join(name);
        std::fs::create_dir(&path).map_err(|error| format!("cannot create a cgroup in {}: {error}", dir.display()))?;
        let opened = (|| {
            let write = |file: &Path| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(file)
                    .map_err(|error| format!("cannot open {}: {error}", file.display()))
            };
            let group = Group {
                parent: File::open(dir).map_err(|error| format!("cannot open {}: {error}", dir.display()))?,
                name: name.to_owned(),
                enter: write(&path.join("cgroup.procs"))?,
                leave: write(&dir.join("cgroup.procs"))?,
            };
            for (file, value) in limits {
                group.write(file, *value)?;
            }
            more(&group)?;
            Ok(group)
        })();
        if opened.is_err() {
            let _ = std::fs::remove_dir(&path);
        }
        opened
    }

    /// Writes `value` into the cgroup's `file`.
    fn write(&self, file: &str, value: u64) -> Result<(), String> {
        let path = format!("/proc/self/fd/{}/{}/{file}", fd_number(&self.parent), self.name);
        std::fs::write(&path, value.to_string()).map_err(|error| format!("cannot set {file}: {error}"))
    }
}

/// The number of an open descriptor.
fn fd_number(file: &File) -> i32 {
    std::os::fd::AsRawFd::as_raw_fd(file)
}

/// Removes the empty cgroups earlier calls left in `dir` (their supervisor
/// was killed before it could); a group still in use is kept (the kernel
/// refuses to remove it).
fn sweep(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(pid) = name
            .strip_prefix(GROUP_PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<i32>().ok())
        else {
            continue;
        };
        // A live supervisor's group is left alone.
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}

/// Whether the v2 cgroup `dir` lets a child of it limit processes and
/// memory.
fn delegates(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.subtree_control")).is_ok_and(|enabled| {
        let enabled: Vec<&str> = enabled.split_whitespace().collect();
        enabled.contains(&"pids") && enabled.contains(&"memory")
    })
}

/// A mounted cgroup hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CgroupMount {
    version: CgroupVersion,
    /// The controllers of a v1 hierarchy.
    controllers: Vec<String>,
    /// The cgroup at the mount's root.
    root: PathBuf,
    /// Where it is mounted.
    point: PathBuf,
}

impl CgroupMount {
    /// Cgroup `path` relative to the mount's root, if it is under it.
    fn relative(&self, path: &Path) -> Option<PathBuf> {
        path.strip_prefix(&self.root).ok().map(Path::to_path_buf)
    }
}

/// The cgroup hierarchies of a mount table.
fn cgroup_mounts(table: &[u8]) -> Vec<CgroupMount> {
    table
        .split(|byte| *byte == b'\n')
        .filter_map(|line| {
            let line = std::str::from_utf8(line).ok()?;
            let (mount, filesystem) = line.split_once(" - ")?;
            let fields: Vec<&str> = mount.split(' ').collect();
            let mut filesystem = filesystem.split(' ');
            let version = match filesystem.next()? {
                "cgroup" => CgroupVersion::V1,
                "cgroup2" => CgroupVersion::V2,
                _ => return None,
            };
            let options = filesystem.nth(1).unwrap_or_default();
            Some(CgroupMount {
                version,
                controllers: options.split(',').map(str::to_owned).collect(),
                root: PathBuf::from(OsString::from_vec(super::namespaces::unescape(
                    fields.get(3)?.as_bytes(),
                ))),
                point: PathBuf::from(OsString::from_vec(super::namespaces::unescape(
                    fields.get(4)?.as_bytes(),
                ))),
            })
        })
        .collect()
}

/// This process's cgroup in `/proc/self/cgroup` text: of the v1 hierarchy
/// holding `controller`, or (`None`) of v2.
fn own_path(own: &str, controller: Option<&str>) -> Option<PathBuf> {
    own.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let matches = match controller {
            None => controllers.is_empty(),
            Some(wanted) => controllers.split(',').any(|c| c == wanted),
        };
        matches.then(|| PathBuf::from(path))
    })
}

/// Sets the rlimits of `limits` on this process (and so on everything it
/// starts), never above a hard limit already in place. Returns what
/// applied, for the status line.
pub(super) fn apply_rlimits(limits: &Limits) -> Result<String, String> {
    let mut applied = Vec::new();
    let mut set = |resource: Resource, name: &str, value: u64, shown: String| -> Result<(), String> {
        let (_, hard) = getrlimit(resource).map_err(|error| format!("cannot read {name}: {error}"))?;
        let soft = value.min(hard);
        // CPU time: the soft limit sends SIGXCPU (a signal that says why),
        // the hard one a second later SIGKILL.
        let new_hard = if resource == Resource::RLIMIT_CPU {
            soft.saturating_add(1).min(hard)
        } else {
            soft
        };
        setrlimit(resource, soft, new_hard).map_err(|error| format!("cannot set {name}: {error}"))?;
        applied.push(shown);
        Ok(())
    };
    // The kernel does not hold uid 0 to RLIMIT_NPROC, whatever its
    // capabilities; for root only a cgroup counts processes.
    if !geteuid().is_root() {
        set(
            Resource::RLIMIT_NPROC,
            "RLIMIT_NPROC",
            limits.processes.into(),
            format!("nproc {}", limits.processes),
        )?;
    }
    set(
        Resource::RLIMIT_DATA,
        "RLIMIT_DATA",
        limits.memory,
        format!("data {}", bytes(limits.memory)),
    )?;
    if let Some(cpu) = limits.cpu_time {
        let seconds = cpu.as_secs().max(1);
        set(Resource::RLIMIT_CPU, "RLIMIT_CPU", seconds, format!("cpu {seconds} s"))?;
    }
    set(
        Resource::RLIMIT_FSIZE,
        "RLIMIT_FSIZE",
        limits.file_size,
        format!("fsize {}", bytes(limits.file_size)),
    )?;
    set(Resource::RLIMIT_CORE, "RLIMIT_CORE", 0, "core 0".into())?;
    Ok(format!("rlimits ({})", applied.join(", ")))
}

/// How the cgroup part of the limits reads in the status line.
pub(super) fn describe_cgroup(cgroup: Option<CgroupLimits>, limits: &Limits) -> String {
    match cgroup {
        Some(cgroup) => {
            let mut parts = Vec::new();
            if cgroup.pids {
                parts.push(format!("pids {}", limits.processes));
            }
            if cgroup.memory {
                parts.push(format!("memory {}", bytes(limits.memory)));
            }
            format!("cgroup {} ({})", cgroup.version.as_str(), parts.join(", "))
        }
        None => "no cgroup".into(),
    }
}

/// A byte count as people read it: `2 GiB`, `512 MiB`, `1000 bytes`.
fn bytes(value: u64) -> String {
    for (unit, name) in [(1u64 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")] {
        if value >= unit && value.is_multiple_of(unit) {
            return format!("{} {name}", value / unit);
        }
    }
    format!("{value} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_mounts_and_paths_are_found() {
        let table = b"35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
                      39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n\
                      41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n\
                      22 1 0:21 / /proc rw - proc proc rw\n";
        let mounts = cgroup_mounts(table);
        assert_eq!(mounts.len(), 3);
        assert_eq!(mounts[1].controllers, ["rw", "pids"]);
        assert_eq!(mounts[2].version, CgroupVersion::V2);
        let own = "12:pids:/user.slice\n4:memory:/\n0::/init.scope\n";
        assert_eq!(own_path(own, Some("pids")), Some(PathBuf::from("/user.slice")));
        assert_eq!(own_path(own, None), Some(PathBuf::from("/init.scope")));
        assert_eq!(own_path(own, Some("cpu")), None);
    }

    #[test]
    fn limits_read_as_people_say_them() {
        let limits = Limits::default();
        assert_eq!(bytes(limits.memory), "2 GiB");
        assert_eq!(bytes(1000), "1000 bytes");
        let cgroup = CgroupLimits {
            version: CgroupVersion::V1,
            pids: true,
            memory: true,
        };
        assert_eq!(
            describe_cgroup(Some(cgroup), &limits),
            "cgroup v1 (pids 512, memory 2 GiB)"
        );
        assert_eq!(
            limits.for_timeout(Duration::from_secs(60)).cpu_time,
            Some(Duration::from_secs(61))
        );
        assert_eq!("v2".parse::<CgroupVersion>(), Ok(CgroupVersion::V2));
    }
}
