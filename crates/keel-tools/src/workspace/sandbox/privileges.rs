//! Dropping every capability before a sandboxed command runs, so that Keel
//! running as root (as it does in many containers) does not lend the
//! command root's powers: no reading other processes' memory or
//! environments (`CAP_SYS_PTRACE`), no bypassing file permissions
//! (`CAP_DAC_OVERRIDE`), no undoing the mounts that confine it
//! (`CAP_SYS_ADMIN`), no changing owners (`CAP_CHOWN`, `CAP_FOWNER`).
//!
//! The bounding set goes too, so that executing a program does not give
//! root its capabilities back; `no_new_privs` (set here, and by Landlock)
//! keeps set-user-ID programs from doing it either.

use caps::CapSet;
use nix::unistd::geteuid;

/// Drops every capability of the calling thread for good, and sets
/// `no_new_privs`. A process without capabilities (Keel not root, no user
/// namespace) cannot clear its bounding set, and needs not: it has nothing
/// to regain but through set-user-ID programs, which `no_new_privs` stops.
pub(super) fn drop_all() -> Result<(), String> {
    nix::sys::prctl::set_no_new_privs().map_err(|error| format!("cannot set no_new_privs: {error}"))?;
    let has_any = caps::read(None, CapSet::Permitted).is_ok_and(|set| !set.is_empty());
    if let Err(error) = caps::clear(None, CapSet::Bounding)
        && (has_any || geteuid().is_root())
    {
        return Err(format!("cannot clear the capability bounding set: {error}"));
    }
    for set in [
        CapSet::Ambient,
        CapSet::Inheritable,
        CapSet::Effective,
        CapSet::Permitted,
    ] {
        caps::clear(None, set).map_err(|error| format!("cannot clear the {set:?} capabilities: {error}"))?;
    }
    Ok(())
}

/// Makes the capabilities this process holds (in the user namespace it
/// just created) survive the execution of the confiner: a process that is
/// not root in its namespace loses them on `execve` unless they are
/// ambient. The confiner drops them all again before the command runs.
pub(super) fn pass_on_to_child() -> Result<(), String> {
    let permitted =
        caps::read(None, CapSet::Permitted).map_err(|error| format!("cannot read capabilities: {error}"))?;
    caps::set(None, CapSet::Inheritable, &permitted)
        .map_err(|error| format!("cannot make capabilities inheritable: {error}"))?;
    for capability in permitted {
        caps::raise(None, CapSet::Ambient, capability)
            .map_err(|error| format!("cannot make {capability} ambient: {error}"))?;
    }
    Ok(())
}
