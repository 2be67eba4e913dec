//! Errors of the checkpoint store.

use std::sync::Arc;

/// A store operation failed. The store's data is as it was before the call.
///
/// Cloneable, so one failed group commit can be reported to every writer
/// whose work was in it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// No session with this id has a checkpoint. Create it with `save` first.
    #[error("unknown session '{0}'")]
    UnknownSession(String),
    /// A session with this id exists already; nothing was written.
    #[error("session '{0}' already exists")]
    Exists(String),
    /// Another runtime took the session over (a newer lease); this writer
    /// must stop. Nothing was written.
    #[error("session '{session_id}' was taken over by another runtime (lease {lease})")]
    Fenced {
        /// The session.
        session_id: String,
        /// The lease now in force.
        lease: u64,
    },
    /// Another owner holds a live lease on the session (see
    /// `CheckpointStore::claim`); nothing was changed.
    #[error("session '{session_id}' is owned by '{owner}' for {expires_in_ms} ms more")]
    Owned {
        /// The session.
        session_id: String,
        /// Who holds its lease.
        owner: String,
        /// How long the lease still runs, in milliseconds, by the store's clock.
        expires_in_ms: u64,
    },
    /// A stored row could not be decoded; the row is left untouched.
    #[error("corrupt {what}: {detail}")]
    Corrupt {
        /// Which row (for example `event 12 of session 'a'`).
        what: String,
        /// What was wrong with it.
        detail: String,
    },
    /// The disk, or the database's configured size limit, is full. Retrying
    /// helps only once space is freed.
    #[error("storage is full: {0}")]
    Full(String),
    /// The file is not a Keel database (or not a database at all).
    #[error("not a keel database: {0}")]
    NotADatabase(String),
    /// The database was written by a newer Keel.
    #[error("database schema version {found} is newer than this keel supports ({supported})")]
    SchemaTooNew {
        /// Version found in the file.
        found: i64,
        /// Newest version this build understands.
        supported: i64,
    },
    /// The input cannot be stored (for example a checkpoint whose session id
    /// does not match the call).
    #[error("invalid write: {0}")]
    Invalid(String),
    /// A value could not be serialized.
    #[error("cannot encode: {0}")]
    Encode(String),
    /// The store was closed.
    #[error("store is closed")]
    Closed,
    /// Another process (a running `keel serve`) holds the database.
    #[error("the database {database} is already served by {holder}")]
    Held {
        /// The database file.
        database: String,
        /// Who holds it (pid and address, as it recorded them).
        holder: String,
    },
    /// The database file was deleted or replaced while open: writes would
    /// go to a file no one will read again, so the store refuses them all.
    #[error("the database file {0} was deleted or replaced while in use; restart keel")]
    Replaced(String),
    /// The database cannot be reached (a server refused, gone away,
    /// shutting down) or its file cannot be written (an I/O error, a
    /// read-only file system); retrying once it is back can succeed. A
    /// write that failed so was not acknowledged.
    #[error("cannot reach the database: {0}")]
    Unavailable(String),
    /// Any other failure of the storage backend (I/O, locking).
    #[error("{0}")]
    Backend(Arc<dyn std::error::Error + Send + Sync>),
}
