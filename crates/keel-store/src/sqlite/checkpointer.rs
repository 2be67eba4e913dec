//! Moves WAL checkpoints off the commit path.
//!
//! SQLite normally checkpoints (copies the WAL back into the database file
//! and fsyncs it) inside whichever commit pushes the WAL past 1000 pages,
//! which stalls that commit and every session waiting on it. Here the
//! writer's WAL hook only signals a checkpointer thread, which runs passive
//! checkpoints on its own connection while the writer keeps committing. If
//! the WAL still grows past a hard limit (the checkpointer cannot keep up,
//! or readers hold old snapshots), the writer checkpoints inline, as SQLite
//! would, so the WAL stays bounded.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use rusqlite::Connection;
use rusqlite::wal::CheckpointMode;

use super::identity::FileIdentity;
use super::writer::WriterCounters;
use crate::StoreError;

/// WAL pages after which a background checkpoint is requested.
const CHECKPOINT_AT_PAGES: i32 = 1000;

/// WAL pages after which the writer checkpoints inline (32 MiB of 4 KiB
/// pages). Under a sustained burst the background checkpoints never catch up
/// completely, and only a complete checkpoint lets the next commit start the
/// WAL over; by then most frames are already copied, so this one is short.
const INLINE_CHECKPOINT_AT_PAGES: i32 = 8192;

/// Starts the checkpointer thread and installs the writer's WAL hook. The
/// thread ends when the writer connection is closed.
pub(super) fn start(
    writer: &mut Connection,
    path: &Path,
    vfs: Option<&str>,
    counters: Arc<WriterCounters>,
    identity: Arc<FileIdentity>,
) -> Result<JoinHandle<()>, StoreError> {
    let conn = super::schema::open_checkpointer(path, vfs)?;
    let (signal, signals) = mpsc::sync_channel::<()>(1);
    let hook_identity = Arc::clone(&identity);
    writer
        .wal_hook(Some(move |wal: &mut rusqlite::hooks::Wal, pages: i32| {
            // See `run`: never on a file system that turned read-only.
            if hook_identity.writable().is_err() {
                return Ok(());
            }
            if pages >= INLINE_CHECKPOINT_AT_PAGES {
                // The commit is done: an error returned here would report
                // it failed. A checkpoint that cannot run now (another
                // connection's is running: `SQLITE_BUSY`) only leaves the
                // WAL longer until the next one.
                if let Err(error) = wal.checkpoint_v2(CheckpointMode::PASSIVE) {
                    tracing::debug!(%error, "inline wal checkpoint did not run");
                }
            } else if pages >= CHECKPOINT_AT_PAGES {
                // Full means a request is already pending.
                let _ = signal.try_send(());
            }
            Ok(())
        }))
        .map_err(super::sqlite_error)?;
    std::thread::Builder::new()
        .name("keel-sqlite-checkpointer".into())
        .spawn(move || run(&conn, &signals, &counters, &identity))
        .map_err(|error| StoreError::Backend(Arc::new(error)))
}

fn run(conn: &Connection, signals: &mpsc::Receiver<()>, counters: &WriterCounters, identity: &FileIdentity) {
    while signals.recv().is_ok() {
        // On a file system that turned read-only after an error, writes
        // may still reach the disk while `fsync` answers success without
        // syncing: a checkpoint could then be half on disk while the next
        // commit starts the WAL over, losing committed frames.
        if identity.writable().is_err() {
            continue;
        }
        match conn.wal_checkpoint_v2(None::<&str>, CheckpointMode::PASSIVE) {
            Ok((log, done)) => {
                counters.checkpoints.fetch_add(1, Ordering::Relaxed);
                tracing::trace!(log, done, "wal checkpoint");
            }
            Err(error) => tracing::warn!(%error, "wal checkpoint failed"),
        }
    }
}
