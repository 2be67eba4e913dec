//! The write jobs a store's writer applies, the same for every backend: what
//! a job is, what it writes once sealed, how it is answered, and how it can
//! fail. Each backend's `writer.rs` applies them in its own way (SQLite on a
//! thread, PostgreSQL in rounds of pipelined statements).

use std::borrow::Cow;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::{AppendReceipt, CheckpointWrite, EncodedEvent, OpenBatch, SessionEdit, StoreError};

/// A write waiting for a writer.
pub(crate) enum Job {
    /// Append events (and maybe a checkpoint write) to an existing session.
    Append {
        session_id: String,
        /// Sealed when the group that carries it starts.
        batch: Arc<OpenBatch>,
        reply: Reply,
    },
    /// Create or rewrite a session's checkpoint.
    Save { write: Box<CheckpointWrite>, reply: Reply },
    /// Create a session that must not exist yet, with its first events.
    Create {
        write: Box<CheckpointWrite>,
        events: Vec<EncodedEvent>,
        reply: Reply,
    },
    /// Take the session over: a new lease, fencing off older holders.
    Acquire { session_id: String, reply: Reply },
    /// Delete the session and everything stored for it.
    Delete { session_id: String, reply: Reply },
    /// Set the session's title.
    Rename {
        session_id: String,
        title: String,
        reply: Reply,
    },
}

impl Job {
    /// The job that writes `write` (creating the session if need be).
    pub(crate) fn save(write: CheckpointWrite, reply: Reply) -> Self {
        Job::Save {
            write: Box::new(write),
            reply,
        }
    }

    /// The job that creates a session with `write` and its first `events`.
    pub(crate) fn create(write: CheckpointWrite, events: Vec<EncodedEvent>, reply: Reply) -> Self {
        Job::Create {
            write: Box::new(write),
            events,
            reply,
        }
    }

    /// The job that applies `edit` to `session_id`.
    pub(crate) fn edit(session_id: &str, edit: SessionEdit<'_>, reply: Reply) -> Self {
        let session_id = session_id.to_owned();
        match edit {
            SessionEdit::Rename { title } => Job::Rename {
                session_id,
                title: title.to_owned(),
                reply,
            },
            SessionEdit::Delete => Job::Delete { session_id, reply },
        }
    }
}

/// What an edit's outcome says: whether the session existed.
pub(crate) fn existed(outcome: Result<Written, StoreError>) -> Result<bool, StoreError> {
    match outcome {
        Ok(_) => Ok(true),
        Err(StoreError::UnknownSession(_)) => Ok(false),
        Err(error) => Err(error),
    }
}

/// Where a job's outcome goes.
pub(crate) type Reply = oneshot::Sender<Result<Written, StoreError>>;

/// What a committed job wrote.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Written {
    /// Where its events landed.
    pub(crate) receipt: AppendReceipt,
    /// The session's lease after the job.
    pub(crate) lease: u64,
}

/// What a job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Append to an existing session, checking the lease if one is given.
    Append { lease: Option<u64> },
    /// Create the session if needed, then write.
    Save,
    /// Create the session, refusing an existing one, then write.
    Create,
    /// Bump the lease.
    Acquire,
    /// Delete the session's rows.
    Delete,
    /// Set the title.
    Rename,
}

/// A job's content, fixed for the transaction.
pub(crate) struct Sealed<'a> {
    pub(crate) session_id: &'a str,
    pub(crate) mode: Mode,
    pub(crate) events: Cow<'a, [EncodedEvent]>,
    pub(crate) checkpoint: Option<Cow<'a, CheckpointWrite>>,
    /// The new title of a rename.
    pub(crate) title: Option<&'a str>,
}

impl Job {
    /// The session the job writes to.
    pub(crate) fn session_id(&self) -> &str {
        match self {
            Job::Save { write, .. } | Job::Create { write, .. } => &write.checkpoint.session_id,
            Job::Append { session_id, .. }
            | Job::Acquire { session_id, .. }
            | Job::Delete { session_id, .. }
            | Job::Rename { session_id, .. } => session_id,
        }
    }

    /// What the job writes. Seals an append's open batch: from here on the
    /// producer's additions go to its next job.
    pub(crate) fn seal(&self) -> Sealed<'_> {
        let bare = |mode| Sealed {
            session_id: self.session_id(),
            mode,
            events: Cow::Borrowed(&[]),
            checkpoint: None,
            title: None,
        };
        match self {
            Job::Save { write, .. } => Sealed {
                checkpoint: Some(Cow::Borrowed(write)),
                ..bare(Mode::Save)
            },
            Job::Create { write, events, .. } => Sealed {
                events: Cow::Borrowed(events),
                checkpoint: Some(Cow::Borrowed(write)),
                ..bare(Mode::Create)
            },
            Job::Append { batch, .. } => {
                let batch = batch.seal();
                Sealed {
                    events: Cow::Owned(batch.events),
                    checkpoint: batch.checkpoint.map(Cow::Owned),
                    ..bare(Mode::Append { lease: batch.lease })
                }
            }
            Job::Acquire { .. } => bare(Mode::Acquire),
            Job::Delete { .. } => bare(Mode::Delete),
            Job::Rename { title, .. } => Sealed {
                title: Some(title),
                ..bare(Mode::Rename)
            },
        }
    }

    /// Answers every job of a committed group with its own outcome, or all
    /// of them with the group's failure (`backend` names the store in the
    /// log line).
    pub(crate) fn answer_group(
        group: &mut Vec<Job>,
        outcome: Result<Vec<Result<Written, StoreError>>, StoreError>,
        backend: &str,
    ) {
        match outcome {
            Ok(outcomes) => {
                for (job, outcome) in group.drain(..).zip(outcomes) {
                    job.answer(outcome);
                }
            }
            Err(error) => {
                tracing::warn!(%error, jobs = group.len(), "{backend} group commit failed");
                for job in group.drain(..) {
                    job.answer(Err(error.clone()));
                }
            }
        }
    }

    /// Sends the job's outcome to whoever queued it.
    pub(crate) fn answer(self, outcome: Result<Written, StoreError>) {
        let reply = match self {
            Job::Append { reply, .. }
            | Job::Save { reply, .. }
            | Job::Create { reply, .. }
            | Job::Acquire { reply, .. }
            | Job::Delete { reply, .. }
            | Job::Rename { reply, .. } => reply,
        };
        // The caller may have given up waiting (cancelled); the write stands.
        let _ = reply.send(outcome);
    }
}

/// Why a job failed, and whether the transaction can go on without it.
pub(crate) enum JobError {
    /// Nothing was written and nothing failed in the database; the
    /// transaction can go on with the other jobs.
    Clean(StoreError),
    /// Part of the job may have been written, or the database aborted the
    /// transaction: it must be abandoned.
    Dirty(StoreError),
}

impl JobError {
    pub(crate) fn into_inner(self) -> StoreError {
        match self {
            JobError::Clean(error) | JobError::Dirty(error) => error,
        }
    }
}

/// Refuses a checkpoint write addressed to another session.
pub(crate) fn check_addressed(session_id: &str, write: &CheckpointWrite) -> Result<(), StoreError> {
    if write.checkpoint.session_id != session_id {
        return Err(StoreError::Invalid(format!(
            "checkpoint of session '{}' written to session '{session_id}'",
            write.checkpoint.session_id
        )));
    }
    Ok(())
}

/// A value's JSON, as the stores keep it.
pub(crate) fn encode<T: serde::Serialize>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|error| StoreError::Encode(error.to_string()))
}

/// The refusal of a write that would store `key` for `submission_id` while
/// it names `holder` already: an idempotency key names one submission.
pub(crate) fn key_taken(key: &str, holder: &str, submission_id: &str) -> StoreError {
    StoreError::Invalid(format!(
        "idempotency key '{key}' names submission {holder} already; submission {submission_id} was not stored"
    ))
}
