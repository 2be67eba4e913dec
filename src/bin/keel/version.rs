//! The version `keel --version` prints: the package's, the git commit it
//! was built from and the build date (recorded by build.rs).

/// `0.1.0 (commit 0123456789ab, built 2026-12-01)`.
pub(crate) const LONG: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("KEEL_GIT_COMMIT"),
    ", built ",
    env!("KEEL_BUILD_DATE"),
    ")"
);
