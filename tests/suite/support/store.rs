//! A database for one test: a temporary SQLite file, and reading back what
//! a session stored in it (or in any store).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use keel::RecordedEvent;
use keel::agent::EventPageRequest;
use keel::store::{CheckpointStore, MAX_EVENT_PAGE, SqliteCheckpoint};

use super::wait::guard;

/// A temporary directory holding one SQLite database file.
pub(crate) struct TestDb {
    dir: tempfile::TempDir,
}

impl TestDb {
    pub(crate) fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temporary directory"),
        }
    }

    /// The database file.
    pub(crate) fn path(&self) -> PathBuf {
        self.dir.path().join("keel.sqlite3")
    }

    /// A new store on the database file, as a new process would open it.
    pub(crate) fn open(&self) -> Arc<SqliteCheckpoint> {
        Arc::new(SqliteCheckpoint::new(self.path()).expect("open the store"))
    }

    pub(crate) fn workspace(&self) -> &Path {
        self.dir.path()
    }
}

/// Every stored event of a session, oldest first, read back page by page.
pub(crate) async fn stored_events(store: &SqliteCheckpoint, session_id: &str) -> Vec<RecordedEvent> {
    stored_events_in(store, session_id).await
}

/// [`stored_events`] from any store.
pub(crate) async fn stored_events_in(store: &dyn CheckpointStore, session_id: &str) -> Vec<RecordedEvent> {
    let mut events = Vec::new();
    let mut before_sequence = None;
    loop {
        let page = guard(
            "event_page",
            store.event_page(
                session_id,
                EventPageRequest {
                    before_sequence,
                    limit: MAX_EVENT_PAGE,
                },
            ),
        )
        .await
        .expect("read an event page");
        let Some(first) = page.events.first() else { break };
        before_sequence = Some(first.sequence);
        let has_more = page.has_more;
        events.splice(0..0, page.events);
        if !has_more {
            break;
        }
    }
    events
}

/// SQLite's own check of the database at `path` says `ok`.
pub(crate) fn assert_integrity_ok(path: impl AsRef<std::path::Path>) {
    let conn = rusqlite::Connection::open(path.as_ref()).expect("open the database");
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .expect("integrity_check");
    assert_eq!(check, "ok", "{}", path.as_ref().display());
}
