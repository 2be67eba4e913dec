//! What each write job does in the writer's transaction: sealing and
//! serializing a job before the transaction starts, then applying it with
//! the prepared [`Statements`] (one appends to many sessions at once, the
//! others one job each), and finding why a write matched no row.

use std::collections::HashMap;

use futures::future::join_all;
use tokio_postgres::Transaction;
use tokio_postgres::types::ToSql;

use super::statements::{Statements, int, uint};
use super::taken_up::{Answering, TakenUp};
use crate::codec::{self, json_array};
use crate::job::{Job, JobError, Mode, Written, check_addressed, encode};
use crate::{AppendReceipt, CheckpointWrite, EncodedEvent, QueueChange, QueuedSubmission, StoreError};
use keel_protocol::TokenUsage;

/// A job sealed and serialized: everything it writes, fixed before the
/// transaction starts, so that encoding errors fail the job cleanly.
pub(super) struct Write {
    pub(super) session_id: String,
    pub(super) mode: Mode,
    /// How many events.
    pub(super) count: u64,
    /// The events' JSON array, stored.
    pub(super) events: Vec<u8>,
    /// What the events do to the queue, by offset in the batch.
    pub(super) queue: Vec<(u64, QueueChange)>,
    /// The relayed submissions this write queues, answered in its
    /// transaction (see [`TakenUp`]).
    pub(super) relays: Answering,
    /// The title the first user message gives, or a rename's title.
    pub(super) title: Option<String>,
    /// The tokens the events report, summed; `None` when none reports any.
    pub(super) usage: Option<TokenUsage>,
    /// The events webhooks may want, by offset in the batch, with their
    /// type; a turn's end once more as `session_idle` (which the queue
    /// statement keeps only when the session has nothing queued).
    pub(super) webhooks: Vec<(u64, &'static str)>,
    pub(super) checkpoint: Option<EncodedWrite>,
    /// Whether the write may leave its session with no turn and nothing
    /// queued: then its turn slot is given back in its transaction.
    pub(super) frees_slot: bool,
}

/// A checkpoint write, serialized.
pub(super) struct EncodedWrite {
    pub(super) checkpoint: Vec<u8>,
    /// The checkpoint's bot, kept in a column of its own for listing.
    pub(super) bot_id: String,
    /// The checkpoint's tenant, stored when the write makes the session.
    pub(super) tenant: String,
    pub(super) execution: Option<Vec<u8>>,
    /// The history items added, as a stored JSON array (`None`: none).
    pub(super) history: Option<Vec<u8>>,
    pub(super) added: u64,
    /// The history's length to cut back to before the items are added.
    pub(super) history_cut: Option<u64>,
}

/// What a job writes, serialized. Seals an append's open batch: from here
/// on the producer's additions go to its next job. The relayed submissions
/// it queues are taken from `taken_up`, to be answered with it. Turn slots
/// are given back only when `slots_in_use` (see
/// `AccessStore::expect_turn_slots`).
pub(super) fn seal(job: &Job, taken_up: &TakenUp, slots_in_use: bool) -> Result<Write, StoreError> {
    let sealed = job.seal();
    let write = Write {
        session_id: sealed.session_id.to_owned(),
        mode: sealed.mode,
        count: 0,
        events: Vec::new(),
        queue: Vec::new(),
        relays: Answering::default(),
        title: sealed.title.map(str::to_owned),
        usage: None,
        webhooks: Vec::new(),
        checkpoint: None,
        frees_slot: false,
    };
    match sealed.mode {
        Mode::Acquire | Mode::Delete | Mode::Rename => Ok(write),
        Mode::Append { .. } | Mode::Save | Mode::Create => {
            let mut write = with_events(write, &sealed.events, sealed.checkpoint.as_deref())?;
            write.relays = taken_up.answering(&write.queue);
            write.frees_slot &= slots_in_use;
            Ok(write)
        }
    }
}

/// Fills in a write's events and checkpoint, serialized.
pub(super) fn with_events(
    mut write: Write,
    events: &[EncodedEvent],
    checkpoint: Option<&CheckpointWrite>,
) -> Result<Write, StoreError> {
    write.count = events.len() as u64;
    write.events = stored(json_array(events.iter().map(|event| event.json.as_str())));
    write.queue = events
        .iter()
        .enumerate()
        .filter_map(|(offset, event)| event.queue.clone().map(|change| (offset as u64, change)))
        .collect();
    write.title = events.iter().find_map(|event| event.title.clone());
    write.usage = EncodedEvent::batch_usage(events);
    write.webhooks = events
        .iter()
        .enumerate()
        .flat_map(|(offset, event)| {
            let idle = event.ends_turn.then_some(keel_protocol::SESSION_IDLE_WEBHOOK);
            [event.webhook, idle]
                .into_iter()
                .flatten()
                .map(move |kind| (offset as u64, kind))
        })
        .collect();
    write.checkpoint = checkpoint
        .map(|checkpoint| encode_write(&write.session_id, checkpoint))
        .transpose()?;
    let no_turn = write.checkpoint.as_ref().map(|write| write.execution.is_none());
    write.frees_slot = EncodedEvent::may_free_turn_slot(events, no_turn);
    Ok(write)
}

/// Writes appends to distinct sessions with one statement ([`APPEND_MANY`]),
/// then their queue changes, and finds why each append that matched no row
/// was refused; returns each job's outcome by its index in the group.
pub(super) async fn append_all(
    tx: &Transaction<'_>,
    st: &Statements,
    appends: &[Indexed<'_>],
    now: u64,
) -> Vec<(usize, Result<Written, JobError>)> {
    if appends.is_empty() {
        return Vec::new();
    }
    let writes: Vec<&Write> = appends.iter().map(|(_, write)| *write).collect();
    fn checkpoint<'w>(write: &&'w Write) -> Option<&'w EncodedWrite> {
        write.checkpoint.as_ref()
    }
    let ids: Vec<&str> = writes.iter().map(|write| write.session_id.as_str()).collect();
    let counts: Vec<i64> = writes.iter().map(|write| int(write.count)).collect();
    let checkpoints: Vec<Option<&[u8]>> = writes
        .iter()
        .map(|write| checkpoint(write).map(|write| write.checkpoint.as_slice()))
        .collect();
    let executions: Vec<Option<&[u8]>> = writes
        .iter()
        .map(|write| checkpoint(write).and_then(|write| write.execution.as_deref()))
        .collect();
    let added: Vec<i64> = writes
        .iter()
        .map(|write| int(checkpoint(write).map_or(0, |write| write.added)))
        .collect();
    let leases: Vec<Option<i64>> = writes
        .iter()
        .map(|write| match write.mode {
            Mode::Append { lease } => lease.map(int),
            _ => None,
        })
        .collect();
    let bots: Vec<Option<&str>> = writes
        .iter()
        .map(|write| checkpoint(write).map(|write| write.bot_id.as_str()))
        .collect();
    let cuts: Vec<Option<i64>> = writes
        .iter()
        .map(|write| checkpoint(write).and_then(|write| write.history_cut).map(int))
        .collect();
    let titles: Vec<Option<&str>> = writes.iter().map(|write| write.title.as_deref()).collect();
    let histories: Vec<Option<&[u8]>> = writes
        .iter()
        .map(|write| checkpoint(write).and_then(|write| write.history.as_deref()))
        .collect();
    let events: Vec<&[u8]> = writes.iter().map(|write| write.events.as_slice()).collect();
    let logged: Vec<bool> = writes
        .iter()
        .map(|write| {
            write.count > 0
                || checkpoint(write).is_some_and(|write| write.history.is_some() || write.history_cut.is_some())
        })
        .collect();
    let ords: Vec<i32> = (0..writes.len())
        .map(|ord| i32::try_from(ord).unwrap_or(i32::MAX))
        .collect();
    let [input, cached, output, reasoning] = usage_columns(writes.iter().map(|write| write.usage.as_ref()));
    let now_sql = int(now);
    let params: [&(dyn ToSql + Sync); 18] = [
        &ids,
        &counts,
        &checkpoints,
        &executions,
        &added,
        &leases,
        &bots,
        &cuts,
        &titles,
        &histories,
        &events,
        &logged,
        &ords,
        &now_sql,
        &input,
        &cached,
        &output,
        &reasoning,
    ];
    let rows = match tx.query(&st.append_many, &params).await {
        Ok(rows) => rows,
        Err(error) => {
            let error = super::pg_error(error);
            return appends
                .iter()
                .map(|&(index, _)| (index, Err(JobError::Dirty(error.clone()))))
                .collect();
        }
    };
    let mut written: Vec<Option<(i64, u64, u64)>> = vec![None; writes.len()];
    for row in &rows {
        let read = (|| -> Result<(usize, (i64, u64, u64)), tokio_postgres::Error> {
            let ord: i32 = row.try_get(0)?;
            Ok((
                usize::try_from(ord).unwrap_or(usize::MAX),
                (row.try_get(1)?, uint(row.try_get(2)?), uint(row.try_get(3)?)),
            ))
        })();
        match read {
            Ok((ord, values)) if ord < written.len() => written[ord] = Some(values),
            Ok(_) => {}
            Err(error) => {
                let error = super::pg_error(error);
                return appends
                    .iter()
                    .map(|&(index, _)| (index, Err(JobError::Dirty(error.clone()))))
                    .collect();
            }
        }
    }
    let queued = webhook_events(
        writes
            .iter()
            .copied()
            .zip(written.iter().map(|written| written.map(|(_, last, _)| last))),
    );
    // A `session_idle` is decided by the queue as the transaction leaves
    // it: when a write that ends a turn also changes its queue, the
    // deliveries wait for the queue's statements instead of riding along.
    let after_queue = writes.iter().any(|write| {
        !write.queue.is_empty()
            && write
                .webhooks
                .iter()
                .any(|&(_, kind)| kind == keel_protocol::SESSION_IDLE_WEBHOOK)
    });
    let queue_webhooks = queue_webhooks(tx, st, &queued, now);
    let applied = join_all(
        appends
            .iter()
            .zip(written)
            .map(|(&(index, write), written)| async move {
                let Some((key, last_sequence, lease)) = written else {
                    let refused = match refusal(tx, st, &write.session_id, write).await {
                        Ok(error) => JobError::Clean(error),
                        Err(error) => error,
                    };
                    return (index, Err(refused));
                };
                let first_sequence = last_sequence + 1 - write.count;
                if !write.queue.is_empty()
                    && let Err(error) = apply_queue_changes(tx, st, key, first_sequence, write, now).await
                {
                    return (index, Err(error));
                }
                // After the queue's statements: the slot stays while work waits.
                if write.frees_slot
                    && let Err(error) = tx.execute(&st.slot_release, &[&key]).await
                {
                    return (index, Err(dirty(error)));
                }
                let receipt = AppendReceipt {
                    first_sequence,
                    recorded_at_ms: now,
                };
                (index, Ok(Written { receipt, lease }))
            }),
    );
    let (mut applied, webhooks) = if after_queue {
        let applied = applied.await;
        (applied, queue_webhooks.await)
    } else {
        futures::join!(applied, queue_webhooks)
    };
    if let Err(error) = webhooks {
        // The transaction is spoilt: every write in it fails.
        for (_, outcome) in &mut applied {
            *outcome = Err(JobError::Dirty(error.clone()));
        }
    }
    applied
}

/// The events of `writes` that webhooks may want, as `(session id,
/// sequence, type)`, given each write's new last sequence (`None`: it was
/// refused and wrote nothing).
fn webhook_events<'w>(writes: impl Iterator<Item = (&'w Write, Option<u64>)>) -> Vec<(&'w str, i64, &'static str)> {
    writes
        .filter_map(|(write, last)| last.map(|last| (write, last + 1 - write.count)))
        .flat_map(|(write, first)| {
            write
                .webhooks
                .iter()
                .map(move |&(offset, kind)| (write.session_id.as_str(), int(first + offset), kind))
        })
        .collect()
}

/// Queues the webhook deliveries of `events` in the transaction (one
/// statement, none when no event is one webhooks may want).
async fn queue_webhooks(
    tx: &Transaction<'_>,
    st: &Statements,
    events: &[(&str, i64, &'static str)],
    now: u64,
) -> Result<(), StoreError> {
    if events.is_empty() {
        return Ok(());
    }
    let sessions: Vec<&str> = events.iter().map(|event| event.0).collect();
    let sequences: Vec<i64> = events.iter().map(|event| event.1).collect();
    let kinds: Vec<&str> = events.iter().map(|event| event.2).collect();
    tx.execute(&st.webhook_queue, &[&sessions, &sequences, &kinds, &int(now)])
        .await
        .map(drop)
        .map_err(super::pg_error)
}

/// Applies one job on its own. The group's appends go through
/// [`append_all`] instead; one given here is written by [`WRITE`], with the
/// same effect.
pub(super) async fn apply(tx: &Transaction<'_>, st: &Statements, write: &Write, now: u64) -> Result<Written, JobError> {
    let session_id = write.session_id.as_str();
    let now_sql = int(now);
    let lease = match write.mode {
        Mode::Acquire => return acquire(tx, st, session_id, now).await,
        Mode::Delete => return delete(tx, st, session_id, now).await,
        Mode::Rename => return rename(tx, st, session_id, write.title.as_deref().unwrap_or_default(), now).await,
        Mode::Append { lease } => lease.map(int),
        Mode::Save | Mode::Create => None,
    };
    let checkpoint = write.checkpoint.as_ref();
    let history_cut = checkpoint.and_then(|write| write.history_cut).map(int);
    let count = int(write.count);
    let added = int(checkpoint.map_or(0, |write| write.added));
    let write_log =
        write.count > 0 || checkpoint.is_some_and(|write| write.history.is_some() || write.history_cut.is_some());
    let [input, cached, output, reasoning] = usage_columns(std::iter::once(write.usage.as_ref()));
    let params: [&(dyn ToSql + Sync); 17] = [
        &count,
        &now_sql,
        &checkpoint.map(|write| write.checkpoint.as_slice()),
        &checkpoint.and_then(|write| write.execution.as_deref()),
        &added,
        &session_id,
        &lease,
        &checkpoint.map(|write| write.bot_id.as_str()),
        &history_cut,
        &write.title,
        &checkpoint.and_then(|write| write.history.as_deref()),
        &write.events.as_slice(),
        &write_log,
        &input[0],
        &cached[0],
        &output[0],
        &reasoning[0],
    ];
    let tenant = checkpoint.map_or(keel_protocol::DEFAULT_TENANT, |write| write.tenant.as_str());
    let row = match write.mode {
        Mode::Create => {
            let created = tx
                .query_opt(&st.insert_session, &[&session_id, &now_sql, &tenant])
                .await
                .map_err(dirty)?;
            if created.is_none() {
                return Err(JobError::Clean(StoreError::Exists(session_id.to_owned())));
            }
            tx.query_opt(&st.write, &params).await.map_err(dirty)?
        }
        Mode::Save => {
            // Both sent at once: the insert runs first, the write sees it.
            let insert: [&(dyn ToSql + Sync); 3] = [&session_id, &now_sql, &tenant];
            let (_, row) = futures::try_join!(
                tx.query_opt(&st.insert_session, &insert),
                tx.query_opt(&st.write, &params),
            )
            .map_err(dirty)?;
            row
        }
        _ => tx.query_opt(&st.write, &params).await.map_err(dirty)?,
    };
    let Some(row) = row else {
        return Err(JobError::Clean(refusal(tx, st, session_id, write).await?));
    };
    let key: i64 = row.try_get(0).map_err(dirty)?;
    let last_sequence = uint(row.try_get(1).map_err(dirty)?);
    let lease = uint(row.try_get(2).map_err(dirty)?);
    let first_sequence = last_sequence + 1 - write.count;
    if !write.queue.is_empty() {
        apply_queue_changes(tx, st, key, first_sequence, write, now).await?;
    }
    // Sent together, after the queue's statements (the slot stays while
    // work waits): neither waits for the other's round trip.
    let release = async {
        if write.frees_slot {
            tx.execute(&st.slot_release, &[&key]).await.map(drop)
        } else {
            Ok(())
        }
    };
    let events = webhook_events(std::iter::once((write, Some(last_sequence))));
    let (released, webhooks) = futures::join!(release, queue_webhooks(tx, st, &events, now));
    released.map_err(dirty)?;
    webhooks.map_err(JobError::Dirty)?;
    Ok(Written {
        receipt: AppendReceipt {
            first_sequence,
            recorded_at_ms: now,
        },
        lease,
    })
}

/// Applies a batch's queue changes: the submissions it queued join the
/// queue (with their idempotency keys), the ones it settled leave it, the
/// keys of the ones it refused are remembered, and the relayed ones it
/// queued are answered.
///
/// Applied in order, changes to one submission leave only the last one in
/// force, and of two uses of one idempotency key the first one stands; so
/// the batch's net changes are computed here, and sent as at most four
/// statements whose order does not matter (pipelined).
async fn apply_queue_changes(
    tx: &Transaction<'_>,
    st: &Statements,
    key: i64,
    first_sequence: u64,
    write: &Write,
    now: u64,
) -> Result<(), JobError> {
    let changes = write.queue.as_slice();
    let mut last: HashMap<&str, (u64, &QueueChange)> = HashMap::new();
    let mut keys: Vec<(&str, &str, u64)> = Vec::new();
    for (offset, change) in changes {
        let sequence = first_sequence + offset;
        let id = match change {
            QueueChange::Queued {
                submission,
                idempotency_key,
            } => {
                if let Some(idempotency_key) = idempotency_key {
                    remember(&mut keys, idempotency_key, &submission.id, sequence)?;
                }
                submission.id.as_str()
            }
            QueueChange::Settled(id) => id.as_str(),
            QueueChange::Refused {
                submission_id,
                idempotency_key,
            } => {
                // Nothing to queue: the key alone is remembered.
                remember(&mut keys, idempotency_key, submission_id, sequence)?;
                continue;
            }
        };
        last.insert(id, (sequence, change));
    }
    let (mut queued_ids, mut queued_sequences, mut queued_json, mut settled) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (id, (sequence, change)) in last {
        match change {
            QueueChange::Queued { submission, .. } => {
                let stored = QueuedSubmission {
                    sequence,
                    ..(**submission).clone()
                };
                let json = serde_json::to_string(&stored)
                    .map_err(|error| JobError::Dirty(StoreError::Encode(error.to_string())))?;
                queued_ids.push(id.to_owned());
                queued_sequences.push(int(sequence));
                queued_json.push(codec::encode(json).into_bytes());
            }
            QueueChange::Settled(_) => settled.push(id.to_owned()),
            QueueChange::Refused { .. } => {}
        }
    }
    let key_names: Vec<&str> = keys.iter().map(|(name, _, _)| *name).collect();
    let key_ids: Vec<&str> = keys.iter().map(|(_, id, _)| *id).collect();
    let key_sequences: Vec<i64> = keys.iter().map(|(_, _, sequence)| int(*sequence)).collect();
    let upsert = async {
        if queued_ids.is_empty() {
            return Ok(0);
        }
        tx.execute(&st.queue_upsert, &[&key, &queued_ids, &queued_sequences, &queued_json])
            .await
    };
    let delete = async {
        if settled.is_empty() {
            return Ok(0);
        }
        tx.execute(&st.queue_delete, &[&key, &settled]).await
    };
    let remember = async {
        if key_names.is_empty() {
            return Ok(Vec::new());
        }
        tx.query(&st.key_insert, &[&key, &key_names, &key_ids, &key_sequences])
            .await
    };
    let relays = write.relays.params(first_sequence, now).map_err(JobError::Dirty)?;
    let answer = async {
        let Some(relays) = &relays else {
            return Ok(0);
        };
        let params: [&(dyn ToSql + Sync); 6] = [
            &key,
            &relays.relay_ids,
            &relays.answers,
            &write.session_id,
            &relays.forget_before,
            &int(now),
        ];
        tx.execute(&st.relay_answer, &params).await
    };
    let (_, _, taken, _) = futures::try_join!(upsert, delete, remember, answer).map_err(dirty)?;
    if let Some(row) = taken.first() {
        let read = |index| row.try_get::<_, String>(index).map_err(dirty);
        return Err(JobError::Dirty(crate::job::key_taken(&read(0)?, &read(1)?, &read(2)?)));
    }
    Ok(())
}

/// Adds `key`'s use by `submission_id` to the batch's `keys`: once per key;
/// a second submission under one key in one batch refuses the write, as a
/// key stored before does.
fn remember<'a>(
    keys: &mut Vec<(&'a str, &'a str, u64)>,
    key: &'a str,
    submission_id: &'a str,
    sequence: u64,
) -> Result<(), JobError> {
    match keys.iter().find(|(known, _, _)| *known == key) {
        None => {
            keys.push((key, submission_id, sequence));
            Ok(())
        }
        Some((_, holder, _)) if *holder == submission_id => Ok(()),
        Some((_, holder, _)) => Err(JobError::Dirty(crate::job::key_taken(key, holder, submission_id))),
    }
}

/// Why a write matched no row: the session is unknown, the cut is longer
/// than its history, or another holder took it over.
async fn refusal(
    tx: &Transaction<'_>,
    st: &Statements,
    session_id: &str,
    write: &Write,
) -> Result<StoreError, JobError> {
    let Some(row) = tx.query_opt(&st.refusal, &[&session_id]).await.map_err(dirty)? else {
        return Ok(StoreError::UnknownSession(session_id.to_owned()));
    };
    let lease = uint(row.try_get(0).map_err(dirty)?);
    let length = uint(row.try_get(1).map_err(dirty)?);
    if let Some(cut) = write.checkpoint.as_ref().and_then(|write| write.history_cut)
        && cut > length
    {
        return Ok(StoreError::Invalid(format!(
            "cannot cut the history of session '{session_id}' to {cut} items: it has {length}"
        )));
    }
    Ok(match write.mode {
        Mode::Append { lease: Some(held) } if held != lease => StoreError::Fenced {
            session_id: session_id.to_owned(),
            lease,
        },
        // Not reachable: the row exists and nothing else refuses.
        _ => StoreError::UnknownSession(session_id.to_owned()),
    })
}

/// Takes the session over for a new holder.
pub(super) async fn acquire(
    tx: &Transaction<'_>,
    st: &Statements,
    session_id: &str,
    now: u64,
) -> Result<Written, JobError> {
    let row = tx
        .query_opt(&st.acquire, &[&int(now), &session_id])
        .await
        .map_err(dirty)?
        .ok_or_else(|| JobError::Clean(StoreError::UnknownSession(session_id.to_owned())))?;
    let lease = uint(row.try_get(0).map_err(dirty)?);
    let last_sequence = uint(row.try_get(1).map_err(dirty)?);
    Ok(Written {
        receipt: AppendReceipt {
            first_sequence: last_sequence + 1,
            recorded_at_ms: now,
        },
        lease,
    })
}

/// Sets a session's title.
pub(super) async fn rename(
    tx: &Transaction<'_>,
    st: &Statements,
    session_id: &str,
    title: &str,
    now: u64,
) -> Result<Written, JobError> {
    tx.query_opt(&st.rename, &[&session_id, &title])
        .await
        .map_err(dirty)?
        .ok_or_else(|| JobError::Clean(StoreError::UnknownSession(session_id.to_owned())))?;
    Ok(Written {
        receipt: AppendReceipt {
            first_sequence: 0,
            recorded_at_ms: now,
        },
        lease: 0,
    })
}

/// Deletes a session's rows: the session, its log, its queue (stored and
/// relayed), its idempotency keys, its usage ledger and its budget, all in
/// the group's transaction.
pub(super) async fn delete(
    tx: &Transaction<'_>,
    st: &Statements,
    session_id: &str,
    now: u64,
) -> Result<Written, JobError> {
    let row = tx
        .query_opt(&st.delete_session, &[&session_id])
        .await
        .map_err(dirty)?
        .ok_or_else(|| JobError::Clean(StoreError::UnknownSession(session_id.to_owned())))?;
    let key: i64 = row.try_get(0).map_err(dirty)?;
    let by_key: [&(dyn ToSql + Sync); 1] = [&key];
    let by_id: [&(dyn ToSql + Sync); 1] = [&session_id];
    futures::try_join!(
        tx.execute(&st.delete_log, &by_key),
        tx.execute(&st.delete_queue, &by_key),
        tx.execute(&st.delete_keys, &by_key),
        tx.execute(&st.delete_access, &by_id),
    )
    .map_err(dirty)?;
    Ok(Written {
        receipt: AppendReceipt {
            first_sequence: 0,
            recorded_at_ms: now,
        },
        lease: 0,
    })
}

/// Checks and serializes a checkpoint write for `session_id`.
fn encode_write(session_id: &str, write: &CheckpointWrite) -> Result<EncodedWrite, StoreError> {
    check_addressed(session_id, write)?;
    let history = if write.transcript_delta.is_empty() {
        None
    } else {
        let items = write
            .transcript_delta
            .iter()
            .map(encode)
            .collect::<Result<Vec<_>, _>>()?;
        Some(stored(json_array(items.iter().map(String::as_str))))
    };
    Ok(EncodedWrite {
        checkpoint: stored(encode(&write.checkpoint)?),
        bot_id: write.checkpoint.session_context.bot_id.clone(),
        tenant: write.checkpoint.session_context.tenant.clone(),
        execution: write.execution.as_ref().map(encode).transpose()?.map(stored),
        history,
        added: write.transcript_delta.len() as u64,
        history_cut: write.history_cut,
    })
}

/// The ledger's columns of the usage of each write, in order: input,
/// cached input, output, reasoning tokens (null where a write reports
/// none).
fn usage_columns<'u>(usages: impl Iterator<Item = Option<&'u TokenUsage>>) -> [Vec<Option<i64>>; 4] {
    let mut columns: [Vec<Option<i64>>; 4] = Default::default();
    for usage in usages {
        let values = usage.map(|usage| {
            [
                usage.input_tokens,
                usage.cached_input_tokens,
                usage.output_tokens,
                usage.reasoning_tokens,
            ]
        });
        for (index, column) in columns.iter_mut().enumerate() {
            column.push(values.map(|values| int(values[index])));
        }
    }
    columns
}

/// The stored bytes of `json` (see [`codec`]).
fn stored(json: String) -> Vec<u8> {
    codec::encode(json).into_bytes()
}

pub(super) fn dirty(error: tokio_postgres::Error) -> JobError {
    JobError::Dirty(super::pg_error(error))
}

/// A job's write and its index in the group.
pub(super) type Indexed<'a> = (usize, &'a Write);
