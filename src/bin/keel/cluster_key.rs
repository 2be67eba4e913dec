//! The key the nodes of a cluster seal what they hand each other with:
//! `--cluster-key-file`, else derived from the API token, else one this
//! host keeps in Keel's data directory, made by the first node that needs
//! it (so nodes on one host share it without set-up).
//!
//! The key never goes into the database (a reader of it could forge
//! hand-overs) and is one of Keel's protected files (a sandboxed command
//! cannot read it). Nodes on several hosts must be given the same file.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// The fewest bytes of secret a key file may hold.
const MIN_SECRET_BYTES: usize = 32;

/// The relay key in a `--cluster-key-file`: at least 32 bytes of secret
/// (surrounding white space ignored), protected from sandboxed commands
/// like the token file.
pub(crate) fn read(path: &Path) -> anyhow::Result<keel::server::RelayKey> {
    let text = std::fs::read(path).with_context(|| format!("cannot read the cluster key file {}", path.display()))?;
    let secret = text.trim_ascii();
    anyhow::ensure!(
        secret.len() >= MIN_SECRET_BYTES,
        "the cluster key file {} holds {} bytes; give it at least {MIN_SECRET_BYTES} (e.g. `openssl rand -hex 32`)",
        path.display(),
        secret.len()
    );
    keel::tools::workspace::sandbox::protect(path);
    Ok(keel::server::RelayKey::derive(secret))
}

/// Where this host keeps the key it made: `cluster.key` in Keel's data
/// directory (`$XDG_DATA_HOME/keel`, `~/.local/share/keel`).
pub(crate) fn host_key_path() -> anyhow::Result<PathBuf> {
    let data = dirs::data_dir().context(
        "no per-user data directory for the cluster key: pass --cluster-key-file FILE \
         (made with `openssl rand -hex 32 > FILE`) or --token-file",
    )?;
    Ok(data.join("keel").join("cluster.key"))
}

/// This host's cluster key at `path`, made there first if it is not yet:
/// 32 random bytes in hex, readable by Keel's user only. Several nodes
/// starting at once agree on one key: each writes a file of its own and
/// links it into place, and a link that finds one there reads that one.
pub(crate) fn host_key(path: &Path) -> anyhow::Result<keel::server::RelayKey> {
    // Protected before it exists, so no command started in between sees it.
    keel::tools::workspace::sandbox::protect(path);
    if !path.exists() {
        make(path).with_context(|| {
            format!(
                "cannot make the cluster key {}: pass --cluster-key-file FILE \
                 (made with `openssl rand -hex 32 > FILE`) or --token-file",
                path.display()
            )
        })?;
    }
    read(path)
}

/// Writes a new key to a file of its own and links it at `path`,
/// unless another process linked one first.
fn make(path: &Path) -> anyhow::Result<()> {
    let directory = path.parent().context("the key's path has no directory")?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(directory)?;
    let mut secret = [0u8; 32];
    rand::fill(&mut secret);
    let text: String = secret.iter().map(|byte| format!("{byte:02x}")).collect();
    let draft = directory.join(format!(".cluster.key.{:016x}", rand::random::<u64>()));
    keel::tools::workspace::sandbox::protect(&draft);
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&draft)?;
        file.write_all(format!("{text}\n").as_bytes())?;
        file.sync_all()?;
        match std::fs::hard_link(&draft, path) {
            Err(error) if error.kind() != std::io::ErrorKind::AlreadyExists => Err(error),
            _ => Ok(()),
        }
    })();
    let _ = std::fs::remove_file(&draft);
    written?;
    tracing::info!(path = %path.display(), "made this host's cluster key");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_starting_at_once_agree_on_one_key_only_their_user_reads() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("keel").join("cluster.key");
        let made: Vec<String> = std::thread::scope(|scope| {
            let starts: Vec<_> = (0..8)
                .map(|_| {
                    scope.spawn(|| {
                        host_key(&path).expect("a key");
                        std::fs::read_to_string(&path).expect("the key file")
                    })
                })
                .collect();
            starts.into_iter().map(|start| start.join().expect("joined")).collect()
        });
        assert!(made.iter().all(|key| key == &made[0]), "{made:?}");
        assert_eq!(made[0].trim().len(), 64);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).expect("metadata").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let left: Vec<_> = std::fs::read_dir(path.parent().expect("dir"))
            .expect("listing")
            .map(|entry| entry.expect("entry").file_name())
            .collect();
        assert_eq!(left, [std::ffi::OsString::from("cluster.key")], "no draft left behind");
        assert!(keel::tools::workspace::sandbox::protected_paths().contains(&path));
    }
}
