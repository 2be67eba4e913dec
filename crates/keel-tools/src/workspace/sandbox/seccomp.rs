//! A seccomp filter that takes the network away from a sandboxed command
//! whatever the kernel's other features: it may create Unix sockets
//! (pipes between its own processes) but no other kind, so no TCP, UDP,
//! raw or netlink socket; and it may not use `io_uring`, whose operations
//! would bypass the filter.
//!
//! It is the layer that holds where the command shares Keel's network
//! namespace (no namespaces could be created) and the kernel's Landlock is
//! too old to restrict UDP.

use std::collections::BTreeMap;

use nix::libc;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};

/// The architecture the filter is compiled for, if seccomp is supported on it.
fn target_arch() -> Option<TargetArch> {
    if cfg!(target_arch = "x86_64") {
        Some(TargetArch::x86_64)
    } else if cfg!(target_arch = "aarch64") {
        Some(TargetArch::aarch64)
    } else if cfg!(target_arch = "riscv64") {
        Some(TargetArch::riscv64)
    } else {
        None
    }
}

/// Installs the filter on the calling thread (and so on everything it
/// executes). Requires `no_new_privs`, which Landlock or the caller sets.
pub(super) fn deny_network() -> Result<(), String> {
    let arch = target_arch().ok_or_else(|| "seccomp filters are not built for this architecture".to_owned())?;
    let program = network_filter(arch)?;
    seccompiler::apply_filter(&program).map_err(|error| format!("cannot install the seccomp filter: {error}"))
}

fn network_filter(arch: TargetArch) -> Result<BpfProgram, String> {
    let invalid = |error: seccompiler::BackendError| format!("invalid seccomp filter: {error}");
    let not_unix = SeccompCondition::new(
        0,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::Ne,
        u64::from(libc::AF_UNIX.unsigned_abs()),
    )
    .map_err(invalid)?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    rules.insert(
        libc::SYS_socket,
        vec![SeccompRule::new(vec![not_unix]).map_err(invalid)?],
    );
    // An empty chain matches every call of the syscall.
    for syscall in [
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
    ] {
        rules.insert(syscall, Vec::new());
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EACCES.unsigned_abs()),
        arch,
    )
    .map_err(invalid)?;
    filter
        .try_into()
        .map_err(|error: seccompiler::BackendError| format!("cannot compile the seccomp filter: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_compiles_for_this_machine() {
        let arch = target_arch().expect("a supported architecture");
        let program = network_filter(arch).expect("filter");
        assert!(!program.is_empty());
    }
}
