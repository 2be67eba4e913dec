//! Tests of the SQLite store against real database files in temporary
//! directories: the store conformance suite (`crate::conformance`),
//! run through [`SqliteFactory`], and the tests of what is SQLite's own
//! (how rows are laid out, the codec, group commit, the WAL, the size cap,
//! corrupt rows, schema migrations).
//!
//! No test depends on timing. Where a test needs several writes in one group
//! commit, it holds SQLite's write lock from a second connection while it
//! submits them (see [`submit_all_while_locked`]), so the writer cannot
//! commit anything until every write is queued.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::future::join_all;
use rusqlite::Connection;
use rusqlite::types::Value;
use tempfile::TempDir;

use super::migration_tests::UNDO_VERSION_7;
use super::{SqliteCheckpoint, SqliteOptions, schema};
use crate::conformance::{
    StoreFactory, append, append_a_foreign_checkpoint, append_from_every_session, assert_gap_free, assert_logs,
    assert_no_hole_after_failure, assistant, batch, check_unknown_session_target, checkpoint, commit_a_turn, create,
    create_quiet, create_s_and_other, create_sessions, doomed_batch, encode, events, execution, guarded,
    history_then_events_then_history, is_ghost, last_sequence, more_history_and_events, page, page_ids, recorded,
    store_conformance_tests, unknown_session_targets, user, whole_log,
};
use crate::{
    AppendBatch, CheckpointStore, CheckpointStoreExt, CheckpointWrite, EventPage, EventPageRequest, MAX_EVENT_PAGE,
    SessionState, StoreError,
};
use keel_protocol::{AssistantContentDeltaEvent, Event, EventMsg, TranscriptItem};

// ---------------------------------------------------------------------------
// The conformance suite
// ---------------------------------------------------------------------------

/// SQLite for the conformance suite: each database a file in a temporary
/// directory of its own, each handle a [`SqliteCheckpoint`] with the default
/// (durable) options.
struct SqliteFactory;

impl StoreFactory for SqliteFactory {
    type Database = (TempDir, PathBuf);
    type Store = SqliteCheckpoint;

    async fn database(&self) -> Self::Database {
        database()
    }

    async fn open(&self, database: &Self::Database) -> SqliteCheckpoint {
        open(&database.1).await
    }

    async fn close(&self, store: &SqliteCheckpoint) {
        store.close().await;
    }
}

store_conformance_tests!(SqliteFactory);
crate::conformance::access_conformance_tests!(SqliteFactory);
crate::conformance::webhook_conformance_tests!(SqliteFactory);

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// A fresh directory and the path of a database file inside it.
pub(super) fn database() -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("keel.sqlite3");
    (dir, path)
}

pub(super) async fn open(path: &Path) -> SqliteCheckpoint {
    open_with(path, SqliteOptions::default()).await
}

async fn open_with(path: &Path, options: SqliteOptions) -> SqliteCheckpoint {
    SqliteCheckpoint::open(path, options).await.expect("open store")
}

/// A ~1 KiB event whose payload does not compress, to fill a database
/// quickly: the store compresses large values, so repetitive text would take
/// next to no room.
fn bulky_event(n: usize) -> Event {
    Event {
        submission_id: None,
        msg: EventMsg::AssistantContentDelta(AssistantContentDeltaEvent {
            turn_id: "turn".into(),
            delta: format!("{n:06} {}", incompressible(n as u64, 1_000)),
        }),
    }
}

/// Asserts that `events`, as one stored batch, stay larger than `bytes` even
/// after LZ4 compression, so that writing them must run out of room.
fn assert_incompressible_past(events: &[Event], bytes: usize) {
    let json = serde_json::to_vec(events).expect("events as JSON");
    let compressed = lz4_flex::block::compress(&json).len();
    assert!(
        compressed > bytes,
        "{} bytes of events compress to {compressed}, not past {bytes}",
        json.len()
    );
}

/// `len` characters of URL-safe base64 drawn from a xorshift stream seeded
/// with `seed`: plain JSON string content that LZ4 cannot shrink.
fn incompressible(seed: u64, len: usize) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut state = seed.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from(ALPHABET[(state >> 58) as usize])
        })
        .collect()
}

/// A second, plain connection to the store's file, for looking behind its back.
fn raw(path: &Path) -> Connection {
    let conn = Connection::open(path).expect("raw connection");
    conn.busy_timeout(Duration::from_secs(30)).expect("busy timeout");
    conn
}

fn raw_count(path: &Path, sql: &str, session_id: &str) -> i64 {
    raw(path)
        .query_row(sql, [session_id], |row| row.get(0))
        .expect("raw count")
}

/// One column of one row as SQLite holds it (text, blob, ...), so that it can
/// be written back exactly; `from_where` is `table WHERE condition`.
fn raw_stored(path: &Path, column: &str, from_where: &str) -> Value {
    raw(path)
        .query_row(&format!("SELECT {column} FROM {from_where}"), [], |row| row.get(0))
        .expect("raw stored value")
}

/// Sets one column of the rows `from_where` (`table WHERE condition`) to
/// `value`, behind the store's back.
fn set_raw(conn: &Connection, column: &str, from_where: &str, value: impl rusqlite::ToSql) {
    let (table, condition) = from_where.split_once(" WHERE ").expect("table WHERE condition");
    let changed = conn
        .execute(&format!("UPDATE {table} SET {column} = ?1 WHERE {condition}"), [value])
        .expect("raw update");
    assert_eq!(changed, 1, "{from_where} is one row");
}

/// The JSON a stored value holds, decoded without the store's codec: text as
/// it is; a compressed blob as the format says, tag 1, the JSON's length
/// (`u32`, little endian), then an LZ4 block; any other blob as plain JSON.
fn stored_json(value: &Value) -> serde_json::Value {
    let bytes = match value {
        Value::Text(text) => text.clone().into_bytes(),
        Value::Blob(blob) if blob.first() != Some(&1) => blob.clone(),
        Value::Blob(blob) => {
            let (length, block) = blob[1..].split_first_chunk::<4>().expect("a length");
            let length = u32::from_le_bytes(*length) as usize;
            let json = lz4_flex::block::decompress(block, length).expect("an LZ4 block");
            assert_eq!(json.len(), length, "the length prefix is the JSON's length");
            json
        }
        other => panic!("expected a stored JSON value, found {other:?}"),
    };
    serde_json::from_slice(&bytes).expect("stored JSON")
}

/// One row of the log, its JSON decoded.
#[derive(Debug, PartialEq)]
struct LogRow {
    first_sequence: u64,
    last_sequence: u64,
    history: Option<serde_json::Value>,
    events: serde_json::Value,
}

/// The row a batch of `events` (numbered from `first_sequence`) adding
/// `history` must be stored as.
fn log_row(first_sequence: u64, history: &[TranscriptItem], events: &[Event]) -> LogRow {
    LogRow {
        first_sequence,
        last_sequence: first_sequence + events.len() as u64 - 1,
        history: (!history.is_empty()).then(|| serde_json::to_value(history).expect("history as JSON")),
        events: serde_json::to_value(events).expect("events as JSON"),
    }
}

/// A session's log rows, in append order.
fn log_rows(path: &Path, session_id: &str) -> Vec<LogRow> {
    raw(path)
        .prepare(
            "SELECT first_sequence, last_sequence, history, events FROM log
             WHERE session_key = (SELECT key FROM sessions WHERE id = ?1) ORDER BY id",
        )
        .expect("prepare")
        .query_map([session_id], |row| {
            Ok((
                row.get(0)?,
                row.get(1)?,
                row.get::<_, Value>(2)?,
                row.get::<_, Value>(3)?,
            ))
        })
        .expect("query")
        .map(|row| {
            let (first_sequence, last_sequence, history, events) = row.expect("log row");
            LogRow {
                first_sequence,
                last_sequence,
                history: (history != Value::Null).then(|| stored_json(&history)),
                events: stored_json(&events),
            }
        })
        .collect()
}

/// `log WHERE ...`: the log rows of `session_id` that match `condition`.
fn log_where(session_id: &str, condition: &str) -> String {
    format!("log WHERE session_key = (SELECT key FROM sessions WHERE id = '{session_id}') AND {condition}")
}

/// Polls `writes` once while another connection holds SQLite's write lock,
/// then releases it.
///
/// Each future submits its first write in that poll; none can finish, since
/// the store's writer cannot begin a transaction (it waits in its busy
/// handler). When the lock goes, the writer commits whatever it had taken
/// before it blocked (the first job, perhaps a few more), then everything
/// else in one transaction. So everything submitted in the poll is committed
/// in at most two transactions, whatever the scheduling.
async fn submit_all_while_locked<F: Future + Unpin>(path: &Path, writes: &mut F) {
    let lock = raw(path);
    lock.execute_batch("BEGIN IMMEDIATE").expect("take the write lock");
    assert!(
        futures::poll!(&mut *writes).is_pending(),
        "no write can finish while the lock is held"
    );
    lock.execute_batch("ROLLBACK").expect("release the write lock");
}
fn wal_path(path: &Path) -> PathBuf {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    PathBuf::from(wal)
}

/// Bytes that are certainly not an SQLite file (a xorshift stream).
fn garbage(len: usize) -> Vec<u8> {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()[3]
        })
        .collect()
}

// ---------------------------------------------------------------------------
// 1. Unknown sessions in a group commit
// ---------------------------------------------------------------------------

#[tokio::test]
async fn append_to_unknown_session_fails_alone_and_writes_nothing_while_its_group_commits() {
    guarded(async {
        let (_dir, path) = database();
        let store = open(&path).await;
        // Two writes to sessions that do not exist, in the middle of the
        // group.
        let (known, targets) = unknown_session_targets(&store).await;

        let before = store.writer_stats();
        let mut writes = Box::pin(join_all(targets.iter().map(|(session_id, batch)| {
            let store = &store;
            let batch = batch.clone();
            async move { store.append(session_id, batch).await }
        })));
        submit_all_while_locked(&path, &mut writes).await;
        let outcomes = writes.await;
        let after = store.writer_stats();
        let ghosts = targets.iter().filter(|(session_id, _)| is_ghost(session_id)).count();
        assert_eq!(
            after.jobs - before.jobs,
            (targets.len() - ghosts) as u64,
            "only written jobs count"
        );
        let committed_events: usize = targets
            .iter()
            .filter(|(session_id, _)| !is_ghost(session_id))
            .map(|(_, batch)| batch.events.len())
            .sum();
        assert_eq!(
            after.events - before.events,
            committed_events as u64,
            "the refused batches' events are not counted as written"
        );
        assert!(
            after.commits - before.commits <= 2,
            "the failing writes shared a transaction with successful ones: {before:?} -> {after:?}"
        );

        for ((session_id, batch), outcome) in targets.iter().zip(outcomes) {
            match check_unknown_session_target(&store, session_id, batch, outcome).await {
                None => assert_eq!(
                    raw_count(&path, "SELECT count(*) FROM sessions WHERE id = ?1", session_id),
                    0,
                    "no session row for {session_id}"
                ),
                Some(sent) => assert_eq!(log_rows(&path, session_id), vec![log_row(1, &[], &sent)]),
            }
        }
        // The log holds one row per committed batch and nothing else: no
        // events or history of the refused batches, under any session key.
        let conn = raw(&path);
        let (rows, with_history): (i64, i64) = conn
            .query_row("SELECT count(*), count(history) FROM log", [], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })
            .expect("count log rows");
        assert_eq!((rows, with_history), (known.len() as i64, 0));
        let orphans: i64 = conn
            .query_row(
                "SELECT count(*) FROM log WHERE session_key NOT IN (SELECT key FROM sessions)",
                [],
                |row| row.get(0),
            )
            .expect("count orphan rows");
        assert_eq!(orphans, 0);
        let transcript_lens: i64 = conn
            .query_row("SELECT sum(transcript_len) FROM sessions", [], |row| row.get(0))
            .expect("sum transcript lengths");
        assert_eq!(transcript_lens, 0, "the refused history was not counted anywhere");
        let sessions = store.list_sessions(100).await.expect("list");
        assert_eq!(
            sessions.len(),
            known.len(),
            "no session was created for the unknown ids"
        );
    })
    .await;
}

// ---------------------------------------------------------------------------
// 2. Group commit
// ---------------------------------------------------------------------------

/// A commit is acknowledged even when its inline checkpoint cannot run
/// because another connection's checkpoint holds the lock (`SQLITE_BUSY`):
/// the WAL hook runs after the commit, and its error was reported as the
/// commit's ("SQL logic error"), stopping the sessions of a committed
/// group. Here a reader keeps the WAL from starting over, so it grows past
/// the inline threshold (32 MiB), while another connection checkpoints in a
/// loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_inline_checkpoint_meets_another_checkpoint_is_acknowledged() {
    let (_dir, path) = database();
    let store = open(&path).await;
    create(&store, "s").await;
    let reader = raw(&path);
    reader
        .execute_batch("BEGIN; SELECT count(*) FROM sessions;")
        .expect("a reader's snapshot");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let checkpointer = {
        let (path, stop) = (path.clone(), std::sync::Arc::clone(&stop));
        std::thread::spawn(move || {
            let conn = raw(&path);
            let mut runs = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
                runs += 1;
            }
            runs
        })
    };
    // 48 commits of ~1 MiB that does not compress: the WAL passes 8192
    // pages after about 32, and each commit after that checkpoints inline.
    for round in 0..48 {
        let events: Vec<Event> = (0..1_000).map(|n| bulky_event(round * 1_000 + n)).collect();
        let appended = store.append("s", batch(&events)).await;
        assert!(appended.is_ok(), "commit {round}: {appended:?}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(checkpointer.join().expect("the checkpointing thread") > 0);
    reader.execute_batch("COMMIT").expect("end the snapshot");
    assert_eq!(store.events_after("s", 0, 10).await.expect("read").len(), 10);
}

#[tokio::test]
async fn sixty_four_concurrent_sessions_share_commits_and_each_log_is_complete() {
    guarded(async {
        const SESSIONS: usize = 64;
        const BATCHES: usize = 20;
        let (_dir, path) = database();
        let store = open(&path).await;
        let sessions = create_sessions(&store, "session", SESSIONS).await;
        let before = store.writer_stats();

        let mut writers = Box::pin(append_from_every_session(&store, &sessions, BATCHES));
        submit_all_while_locked(&path, &mut writers).await;
        let expected_logs = writers.await;

        let after = store.writer_stats();
        let jobs = after.jobs - before.jobs;
        let commits = after.commits - before.commits;
        let events_written: usize = expected_logs.iter().map(Vec::len).sum();
        assert_eq!(jobs, (SESSIONS * BATCHES) as u64);
        assert_eq!(after.events - before.events, events_written as u64);
        assert!(commits >= 1);
        assert!(
            commits < jobs,
            "group commit grouped nothing: {commits} commits for {jobs} jobs"
        );

        assert_logs(&store, &sessions, &expected_logs).await;
    })
    .await;
}

#[tokio::test]
async fn max_jobs_per_commit_of_one_commits_every_job_alone() {
    guarded(async {
        let (_dir, path) = database();
        let options = SqliteOptions {
            max_jobs_per_commit: 1,
            ..SqliteOptions::default()
        };
        let store = open_with(&path, options).await;
        let sessions: Vec<String> = (0..8).map(|n| format!("solo-{n}")).collect();
        for session_id in &sessions {
            create(&store, session_id).await;
        }
        // Queue everything up at once, as in the grouped test: the writer
        // still takes one job per transaction.
        let mut writers = Box::pin(join_all(sessions.iter().map(|session_id| {
            let store = &store;
            async move {
                let mut expected = Vec::new();
                for round in 0..10 {
                    expected.extend(append(store, session_id, &events(session_id, round * 2, 2)).await);
                }
                expected
            }
        })));
        submit_all_while_locked(&path, &mut writers).await;
        let expected_logs = writers.await;

        let stats = store.writer_stats();
        assert_eq!(stats.jobs, 8 + 8 * 10, "saves and appends");
        assert_eq!(stats.commits, stats.jobs);
        assert_eq!(stats.events, 8 * 10 * 2);
        for (session_id, expected) in sessions.iter().zip(&expected_logs) {
            let log = whole_log(&store, session_id).await;
            assert_gap_free(&log);
            assert_eq!(&log, expected);
        }
    })
    .await;
}

// ---------------------------------------------------------------------------
// 3. How saves and appends lie in the log
// ---------------------------------------------------------------------------

#[tokio::test]
async fn saves_that_add_history_are_log_rows_without_events_at_the_next_sequence() {
    guarded(async {
        let (_dir, path) = database();
        let store = open(&path).await;
        store
            .save(&checkpoint("s", "bot-1", 0), &[], None)
            .await
            .expect("create");
        let turn = execution("turn-1");
        store
            .save(
                &checkpoint("s", "bot-1", 3),
                &[user("hi"), assistant("hello", false)],
                Some(&turn),
            )
            .await
            .expect("save with history and a running turn");
        append(&store, "s", &events("s", 0, 4)).await;
        store
            .save(
                &checkpoint("s", "bot-1", 5),
                &[user("more"), assistant("cut off", true)],
                Some(&turn),
            )
            .await
            .expect("save again");
        store
            .save(&checkpoint("s", "bot-1", 6), &[], None)
            .await
            .expect("clear the running turn");

        // Each save that added history is one log row without events, at the
        // sequence the next event will take; the saves without history (the
        // creation, the last one) wrote no row.
        let sent = events("s", 0, 4);
        assert_eq!(
            log_rows(&path, "s"),
            vec![
                log_row(1, &[user("hi"), assistant("hello", false)], &[]),
                log_row(1, &[], &sent),
                log_row(5, &[user("more"), assistant("cut off", true)], &[]),
            ]
        );
        assert_eq!(
            raw_count(&path, "SELECT transcript_len FROM sessions WHERE id = ?1", "s"),
            4
        );

        // Another session's save adds no row to this one.
        store
            .save(&checkpoint("t", "bot-2", 1), &[user("other")], None)
            .await
            .expect("save t");
        assert_eq!(log_rows(&path, "s").len(), 3);
        assert_eq!(log_rows(&path, "t"), vec![log_row(1, &[user("other")], &[])]);
    })
    .await;
}

#[tokio::test]
async fn a_batch_failing_after_its_checkpoint_write_leaves_nothing_and_no_hole() {
    guarded(async {
        let (_dir, path) = database();
        let store = open(&path).await;

        // A committed batch (what the conformance suite checks through the
        // trait), one log row.
        let committed = commit_a_turn(&store).await;
        let rows = vec![
            log_row(1, &[user("hi")], &[]),
            log_row(1, &[assistant("hello", false), user("again")], &committed.sent),
        ];
        assert_eq!(log_rows(&path, "s"), rows);

        // Failure after the checkpoint write (the session row already took
        // the sequences, the checkpoint and the history count): a trigger
        // refuses the batch's log row, which carries its events and its
        // history. Nothing of the batch stays. The trigger fires while a row
        // sits in `poison`, whatever the row's encoding.
        raw(&path)
            .execute_batch(
                "CREATE TABLE poison (armed INTEGER);
                 INSERT INTO poison VALUES (1);
                 CREATE TRIGGER refuse_poison BEFORE INSERT ON log
                 WHEN EXISTS (SELECT 1 FROM poison)
                 BEGIN SELECT RAISE(ABORT, 'poisoned event'); END;",
            )
            .expect("create trigger");
        let error = store
            .append("s", doomed_batch("poison", None))
            .await
            .expect_err("the trigger refuses the batch");
        assert!(
            matches!(&error, StoreError::Backend(_)) && error.to_string().contains("poisoned event"),
            "{error:?}"
        );
        assert_eq!(store.load("s").await.expect("load"), Some(committed.state.clone()));
        assert_eq!(whole_log(&store, "s").await, committed.log);
        assert_eq!(log_rows(&path, "s"), rows, "no row of the failed batch");
        assert_eq!(
            raw_count(&path, "SELECT transcript_len FROM sessions WHERE id = ?1", "s"),
            3,
            "the failed batch's history is not counted"
        );
        raw(&path)
            .execute_batch("DELETE FROM poison")
            .expect("disarm the trigger");

        // The failed batch left no hole: the next one continues at 4.
        let next = assert_no_hole_after_failure(&store, &committed).await;
        let mut rows = rows;
        rows.push(log_row(4, &[], &next));
        assert_eq!(log_rows(&path, "s"), rows);
    })
    .await;
}

#[tokio::test]
async fn a_refused_foreign_checkpoint_adds_no_log_row() {
    guarded(async {
        let (_dir, path) = database();
        let store = open(&path).await;
        create_s_and_other(&store).await;
        let rows_before = (log_rows(&path, "s"), log_rows(&path, "other"));

        for foreign in ["other", "nobody"] {
            append_a_foreign_checkpoint(&store, foreign).await;
            assert_eq!((log_rows(&path, "s"), log_rows(&path, "other")), rows_before);
        }
    })
    .await;
}

#[tokio::test]
async fn batches_with_history_but_no_events_are_log_rows_without_events() {
    guarded(async {
        let (_dir, path) = database();
        let store = open(&path).await;

        // History before any event, events, then history from an append that
        // carries only a checkpoint write and from a save, more events, and
        // history after the last event.
        let first = events("s", 0, 5);
        history_then_events_then_history(&store, &first).await;
        let second = events("s", 5, 3);
        more_history_and_events(&store, &second).await;

        // A session that has history and never had an event.
        create_quiet(&store).await;

        assert_eq!(
            log_rows(&path, "s"),
            vec![
                log_row(1, &[user("u1")], &[]),
                log_row(1, &[], &first),
                log_row(6, &[assistant("a1", false), user("u2")], &[]),
                log_row(6, &[assistant("a2", true)], &[]),
                log_row(6, &[], &second),
                log_row(9, &[user("u3")], &[]),
            ]
        );
        assert_eq!(
            log_rows(&path, "quiet"),
            vec![
                log_row(1, &[user("q1")], &[]),
                log_row(1, &[assistant("q2", false)], &[]),
            ]
        );
        store.close().await;
    })
    .await;
}

// ---------------------------------------------------------------------------
// 4. Corrupt rows
// ---------------------------------------------------------------------------

/// One column of one row exactly as SQLite holds it: its storage class and
/// its bytes (which need not be UTF-8).
fn raw_value(path: &Path, column: &str, from_where: &str) -> (String, Option<Vec<u8>>) {
    raw(path)
        .query_row(
            &format!("SELECT typeof({column}), CAST({column} AS BLOB) FROM {from_where}"),
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .expect("raw value")
}

fn text_value(text: &str) -> (String, Option<Vec<u8>>) {
    ("text".into(), Some(text.as_bytes().to_vec()))
}

fn assert_corrupt<T: std::fmt::Debug>(outcome: Result<T, StoreError>, expected_what: &str) {
    match outcome {
        Err(StoreError::Corrupt { what, detail }) => {
            assert_eq!(what, expected_what);
            assert!(!detail.is_empty());
        }
        other => panic!("expected Corrupt {{ what: {expected_what:?} }}, got {other:?}"),
    }
}

#[tokio::test]
async fn corrupt_event_checkpoint_and_history_rows_are_named_and_left_untouched() {
    guarded(async {
        let (_dir, path) = database();
        let store = open(&path).await;
        let sessions = ["events-hit", "checkpoint-hit", "history-hit", "count-hit", "healthy"];
        // Per session: a save with three history items, three batches of two
        // events each, then a save with a fourth item. The log holds one row
        // per batch: history at 1, events 1-2, 3-4, 5-6, history at 7.
        let mut logs = Vec::new();
        for session_id in sessions {
            store
                .save(
                    &checkpoint(session_id, "bot", 1),
                    &[user("one"), assistant("two", false), user("three")],
                    None,
                )
                .await
                .expect("create");
            let mut log = Vec::new();
            for first in [0, 2, 4] {
                log.extend(append(&store, session_id, &events(session_id, first, 2)).await);
            }
            store
                .save(&checkpoint(session_id, "bot", 2), &[assistant("four", false)], None)
                .await
                .expect("save more history");
            logs.push(log);
        }
        let healthy_state = store.load("healthy").await.expect("load");
        assert_eq!(
            healthy_state.as_ref().map(|state| (state.transcript.len(), state.last_sequence)),
            Some((4, 6))
        );

        let bad_events = "[{\"submission_id\": null, \"msg\": {\"type\": \"turn_sta";
        let bad_history = "[{\"type\": \"no_such_item\", \"text\": 5}]";
        // Well-formed, but one item short of what the session row counts.
        let short_history = serde_json::to_string(&[user("one"), user("three")]).expect("JSON");
        let conn = raw(&path);
        set_raw(&conn, "events", &log_where("events-hit", "first_sequence = 3"), bad_events);
        conn.execute(
            "UPDATE sessions SET checkpoint = ?1 WHERE id = 'checkpoint-hit'",
            ["not json at all"],
        )
        .expect("corrupt a checkpoint");
        set_raw(&conn, "history", &log_where("history-hit", "first_sequence = 7"), bad_history);
        set_raw(&conn, "history", &log_where("count-hit", "last_sequence = 0"), &short_history);
        drop(conn);

        // The batch (events 3 and 4): pages that include it fail and name it;
        // pages around it work.
        assert_corrupt(
            store
                .event_page(
                    "events-hit",
                    EventPageRequest {
                        before_sequence: None,
                        limit: 10,
                    },
                )
                .await,
            "events 3 to 4 of session 'events-hit'",
        );
        assert_eq!(
            page(&store, "events-hit", Some(3), 10).await,
            EventPage {
                events: logs[0][..2].to_vec(),
                has_more: false,
            }
        );
        assert_eq!(
            page(&store, "events-hit", None, 2).await,
            EventPage {
                events: logs[0][4..].to_vec(),
                has_more: true,
            }
        );
        // Its checkpoint and history are fine.
        assert_eq!(
            store.load("events-hit").await.expect("load"),
            Some(SessionState {
                checkpoint: checkpoint("events-hit", "bot", 2),
                ..healthy_state.clone().expect("healthy state")
            })
        );

        // The checkpoint: load fails and names it; its events still read.
        assert_corrupt(
            store.load("checkpoint-hit").await,
            "checkpoint of session 'checkpoint-hit'",
        );
        assert_eq!(whole_log(&store, "checkpoint-hit").await, logs[1]);

        // The history row: load fails and names it by the event it was
        // recorded at; the events still read.
        assert_corrupt(
            store.load("history-hit").await,
            "history recorded at event 7 of session 'history-hit'",
        );
        assert_eq!(whole_log(&store, "history-hit").await, logs[2]);

        // A history that decodes but lost an item: load fails and names the
        // session's history.
        assert_corrupt(store.load("count-hit").await, "history of session 'count-hit'");
        assert_eq!(whole_log(&store, "count-hit").await, logs[3]);

        // The healthy session reads as before.
        assert_eq!(store.load("healthy").await.expect("load"), healthy_state);
        assert_eq!(whole_log(&store, "healthy").await, logs[4]);

        // Reading did not repair, delete or rewrite anything.
        assert_eq!(
            raw_value(&path, "events", &log_where("events-hit", "first_sequence = 3")),
            text_value(bad_events)
        );
        assert_eq!(
            raw_value(&path, "checkpoint", "sessions WHERE id = 'checkpoint-hit'"),
            text_value("not json at all")
        );
        assert_eq!(
            raw_value(&path, "history", &log_where("history-hit", "first_sequence = 7")),
            text_value(bad_history)
        );
        assert_eq!(
            raw_value(&path, "history", &log_where("count-hit", "last_sequence = 0")),
            text_value(&short_history)
        );
        for session_id in sessions {
            assert_eq!(
                raw_count(
                    &path,
                    "SELECT count(*) FROM log WHERE session_key = (SELECT key FROM sessions WHERE id = ?1)",
                    session_id
                ),
                5,
                "{session_id}: every row is still there"
            );
            assert_eq!(
                raw_count(
                    &path,
                    "SELECT sum(last_sequence - first_sequence + 1) FROM log WHERE session_key = (SELECT key FROM sessions WHERE id = ?1)",
                    session_id
                ),
                6,
                "{session_id}: every event is still there"
            );
            assert_eq!(
                raw_count(&path, "SELECT transcript_len FROM sessions WHERE id = ?1", session_id),
                4,
                "{session_id}: the history count is unchanged"
            );
        }

        // Writing to the damaged sessions still works and keeps the sequence.
        let receipt = store
            .append("events-hit", batch(&events("events-hit", 6, 1)))
            .await
            .expect("append");
        assert_eq!(receipt.first_sequence, 7);
    })
    .await;
}

#[tokio::test]
async fn stored_values_of_any_damaged_shape_read_as_corrupt_not_as_backend_errors() {
    guarded(async {
        let (_dir, path) = database();
        let store = open(&path).await;
        // A small history row and a small batch (stored as text), then a
        // batch with enough events and history that both are compressed.
        let mut state = SessionState {
            checkpoint: checkpoint("s", "bot", 1),
            transcript: vec![user("zero"), user("one")],
            execution: Some(execution("turn")),
            last_sequence: 3,
            queued: Vec::new(),
        };
        store
            .save(&state.checkpoint, &state.transcript, state.execution.as_ref())
            .await
            .expect("save");
        let mut log = append(&store, "s", &events("s", 0, 3)).await;
        let many = events("s", 3, 60);
        let delta: Vec<TranscriptItem> = (0..40).map(|n| user(&format!("item {n} of the long turn"))).collect();
        let receipt = store
            .append(
                "s",
                AppendBatch {
                    lease: None,
                    events: encode(&many),
                    checkpoint: Some(CheckpointWrite {
                        checkpoint: checkpoint("s", "bot", 2),
                        transcript_delta: delta.clone(),
                        execution: Some(execution("turn")),
                        history_cut: None,
                    }),
                },
            )
            .await
            .expect("append a large batch");
        log.extend(recorded(receipt, &many));
        state.checkpoint = checkpoint("s", "bot", 2);
        state.transcript.extend(delta.iter().cloned());
        state.last_sequence = 63;
        let rows = vec![
            log_row(1, &state.transcript[..2], &[]),
            log_row(
                1,
                &[],
                &log[..3].iter().map(|event| event.event.clone()).collect::<Vec<_>>(),
            ),
            log_row(4, &delta, &many),
        ];
        assert_eq!(log_rows(&path, "s"), rows);

        // (column, row, how the store names it, how SQLite holds it intact)
        let places = [
            (
                "events",
                log_where("s", "last_sequence = 3"),
                "events 1 to 3 of session 's'",
                "text",
            ),
            (
                "events",
                log_where("s", "first_sequence = 4"),
                "events 4 to 63 of session 's'",
                "blob",
            ),
            (
                "checkpoint",
                "sessions WHERE id = 's'".to_owned(),
                "checkpoint of session 's'",
                "text",
            ),
            (
                "execution",
                "sessions WHERE id = 's'".to_owned(),
                "checkpoint of session 's'",
                "text",
            ),
            (
                "history",
                log_where("s", "last_sequence = 0"),
                "history recorded at event 1 of session 's'",
                "text",
            ),
            (
                "history",
                log_where("s", "first_sequence = 4"),
                "history recorded at event 4 of session 's'",
                "blob",
            ),
        ];
        let hex = |bytes: &[u8]| bytes.iter().map(|byte| format!("{byte:02x}")).collect::<String>();
        let not_json = b"not json at all, but compressed";
        let not_json_length = u32::try_from(not_json.len()).expect("short");
        // Random bytes (a blob), text that is not UTF-8, a number, empty
        // values, well-formed JSON of the wrong shape, and compressed blobs
        // that are truncated, claim an absurd length, hold a block that is
        // not LZ4, or expand to something that is not JSON.
        let damages = [
            format!("x'{}'", hex(&garbage(300))),
            "CAST(x'c328ff80fe' AS TEXT)".to_owned(),
            "42".to_owned(),
            "''".to_owned(),
            "x''".to_owned(),
            "'[1, 2, 3]'".to_owned(),
            "x'0105'".to_owned(),
            format!("x'01ffffffff{}'", hex(&garbage(40))),
            format!("x'0164000000{}'", hex(&garbage(64))),
            format!(
                "x'01{}{}'",
                hex(&not_json_length.to_le_bytes()),
                hex(&lz4_flex::block::compress(not_json))
            ),
        ];
        let conn = raw(&path);
        for (column, row, what, storage) in &places {
            let (table, condition) = row.split_once(" WHERE ").expect("row");
            let original = raw_stored(&path, column, row);
            assert_eq!(raw_value(&path, column, row).0, *storage, "{column} of {row} as stored");
            for damage in &damages {
                conn.execute(&format!("UPDATE {table} SET {column} = {damage} WHERE {condition}"), [])
                    .expect("damage");
                let damaged = raw_value(&path, column, row);
                if table == "log" && *column == "events" {
                    assert_corrupt(
                        store
                            .event_page(
                                "s",
                                EventPageRequest {
                                    before_sequence: None,
                                    limit: MAX_EVENT_PAGE,
                                },
                            )
                            .await,
                        what,
                    );
                } else {
                    assert_corrupt(store.load("s").await, what);
                }
                if table == "sessions" {
                    assert_corrupt(store.list_sessions(10).await, what);
                }
                assert_eq!(
                    raw_value(&path, column, row),
                    damaged,
                    "reading left {column} as it was"
                );
                set_raw(&conn, column, row, &original);
            }
            assert_eq!(raw_stored(&path, column, row), original, "{column} of {row} repaired");
        }
        // Repaired, everything reads again.
        assert_eq!(store.load("s").await.expect("load"), Some(state));
        assert_eq!(whole_log(&store, "s").await, log);
        assert_eq!(log_rows(&path, "s"), rows);
    })
    .await;
}

// ---------------------------------------------------------------------------
// 5. Compressed rows
// ---------------------------------------------------------------------------

/// History items that differ from one another but repeat their shape, as a
/// long turn's do.
fn long_history(count: usize) -> Vec<TranscriptItem> {
    (0..count)
        .map(|n| match n % 2 {
            0 => user(&format!("question {n}: ünïcødé ✓ \"quoted\"")),
            _ => assistant(&format!("answer {n}, at some length"), n % 3 == 0),
        })
        .collect()
}

/// Asserts that `value` is stored compressed: a blob with the LZ4 tag,
/// clearly smaller than the JSON it holds.
fn assert_compressed(value: &Value, json: &serde_json::Value) {
    let Value::Blob(blob) = value else {
        panic!("expected a compressed blob, found {value:?}")
    };
    assert_eq!(blob.first(), Some(&1), "the LZ4 tag");
    let plain = serde_json::to_string(json).expect("JSON").len();
    assert!(blob.len() < plain / 2, "{} bytes for {plain} bytes of JSON", blob.len());
    assert_eq!(&stored_json(value), json);
}

#[tokio::test]
async fn large_batches_are_stored_compressed_and_read_back_equal() {
    guarded(async {
        let (_dir, path) = database();
        let store = open(&path).await;
        store
            .save(&checkpoint("s", "bot", 0), &[user("first")], None)
            .await
            .expect("create");
        let small = events("s", 0, 2);
        let mut log = append(&store, "s", &small).await;
        let many = events("s", 2, 500);
        let delta = long_history(200);
        let receipt = store
            .append(
                "s",
                AppendBatch {
                    lease: None,
                    events: encode(&many),
                    checkpoint: Some(CheckpointWrite {
                        checkpoint: checkpoint("s", "bot", 1),
                        transcript_delta: delta.clone(),
                        execution: Some(execution("turn")),
                        history_cut: None,
                    }),
                },
            )
            .await
            .expect("append a large batch");
        assert_eq!(receipt.first_sequence, 3);
        log.extend(recorded(receipt, &many));
        let tail = events("s", 502, 1);
        log.extend(append(&store, "s", &tail).await);

        // The large batch's events and history are compressed; the small
        // rows are plain text.
        let big = log_where("s", "first_sequence = 3");
        assert_compressed(
            &raw_stored(&path, "events", &big),
            &serde_json::to_value(&many).expect("JSON"),
        );
        assert_compressed(
            &raw_stored(&path, "history", &big),
            &serde_json::to_value(&delta).expect("JSON"),
        );
        for (column, row) in [
            ("history", log_where("s", "last_sequence = 0")),
            ("events", log_where("s", "first_sequence = 1 AND last_sequence = 2")),
            ("events", log_where("s", "first_sequence = 503")),
        ] {
            assert_eq!(raw_value(&path, column, &row).0, "text", "{column} of {row}");
        }
        let rows = vec![
            log_row(1, &[user("first")], &[]),
            log_row(1, &[], &small),
            log_row(3, &delta, &many),
            log_row(503, &[], &tail),
        ];
        assert_eq!(log_rows(&path, "s"), rows);

        let mut transcript = vec![user("first")];
        transcript.extend(delta.iter().cloned());
        let state = SessionState {
            checkpoint: checkpoint("s", "bot", 1),
            transcript,
            execution: Some(execution("turn")),
            last_sequence: 503,
            queued: Vec::new(),
        };
        assert_eq!(store.load("s").await.expect("load"), Some(state.clone()));
        let read = whole_log(&store, "s").await;
        assert_gap_free(&read);
        assert_eq!(read, log);
        // Pages that start, end or lie inside the compressed row.
        for (before, limit, from) in [(250, 10, 240), (503, 500, 3), (4, 10, 1), (504, 3, 501), (3, 10, 1)] {
            let to = before - 1;
            assert_eq!(
                page(&store, "s", Some(before), limit).await,
                EventPage {
                    events: log[from as usize - 1..to as usize].to_vec(),
                    has_more: from > 1,
                },
                "before {before}, limit {limit}"
            );
        }

        // Plain JSON stored as a blob (as another tool might write it) is
        // read too.
        raw(&path)
            .execute_batch(
                "UPDATE log SET events = CAST(events AS BLOB) WHERE typeof(events) = 'text';
                 UPDATE log SET history = CAST(history AS BLOB) WHERE typeof(history) = 'text';",
            )
            .expect("store the small rows as blobs");
        for (column, row) in [
            ("history", log_where("s", "last_sequence = 0")),
            ("events", log_where("s", "first_sequence = 503")),
        ] {
            assert_eq!(raw_value(&path, column, &row).0, "blob", "{column} of {row}");
        }
        assert_eq!(store.load("s").await.expect("load"), Some(state.clone()));
        assert_eq!(whole_log(&store, "s").await, log);

        // And after a reopen.
        store.close().await;
        let store = open(&path).await;
        assert_eq!(store.load("s").await.expect("load"), Some(state));
        assert_eq!(whole_log(&store, "s").await, log);
        assert_eq!(log_rows(&path, "s"), rows);
        store.close().await;
    })
    .await;
}

#[tokio::test]
async fn compressed_values_with_a_damaged_length_prefix_read_as_corrupt_and_are_left_untouched() {
    guarded(async {
        let (_dir, path) = database();
        let store = open(&path).await;
        create(&store, "s").await;
        let mut log = append(&store, "s", &events("s", 0, 3)).await;
        let many = events("s", 3, 400);
        let delta = long_history(100);
        let receipt = store
            .append(
                "s",
                AppendBatch {
                    lease: None,
                    events: encode(&many),
                    checkpoint: Some(CheckpointWrite {
                        checkpoint: checkpoint("s", "bot", 1),
                        transcript_delta: delta.clone(),
                        execution: None,
                        history_cut: None,
                    }),
                },
            )
            .await
            .expect("append a large batch");
        assert_eq!(receipt.first_sequence, 4);
        log.extend(recorded(receipt, &many));
        log.extend(append(&store, "s", &events("s", 403, 3)).await);
        let state = store.load("s").await.expect("load");
        assert_eq!(
            state.as_ref().map(|state| (&state.transcript, state.last_sequence)),
            Some((&delta, 406))
        );
        let rows = log_rows(&path, "s");
        let row = log_where("s", "first_sequence = 4");
        let conn = raw(&path);

        for (column, json) in [
            ("events", serde_json::to_value(&many).expect("JSON")),
            ("history", serde_json::to_value(&delta).expect("JSON")),
        ] {
            let original = raw_stored(&path, column, &row);
            assert_compressed(&original, &json);
            let Value::Blob(blob) = &original else {
                unreachable!("checked above")
            };
            let length = u32::from_le_bytes(blob[1..5].try_into().expect("four bytes"));
            for wrong in [length - 1, length + 1, length / 2, length * 2, 0, u32::MAX] {
                let mut damaged = blob.clone();
                damaged[1..5].copy_from_slice(&wrong.to_le_bytes());
                let damaged = Value::Blob(damaged);
                set_raw(&conn, column, &row, &damaged);
                if column == "events" {
                    // Pages that include the row fail and name it; pages
                    // around it read.
                    for (before, limit) in [(None, MAX_EVENT_PAGE), (Some(100), 10), (Some(404), 1)] {
                        assert_corrupt(
                            store
                                .event_page(
                                    "s",
                                    EventPageRequest {
                                        before_sequence: before,
                                        limit,
                                    },
                                )
                                .await,
                            "events 4 to 403 of session 's'",
                        );
                    }
                    assert_eq!(
                        page(&store, "s", None, 3).await,
                        EventPage {
                            events: log[403..].to_vec(),
                            has_more: true,
                        }
                    );
                    assert_eq!(
                        page(&store, "s", Some(4), 10).await,
                        EventPage {
                            events: log[..3].to_vec(),
                            has_more: false,
                        }
                    );
                    assert_eq!(store.load("s").await.expect("load"), state);
                } else {
                    assert_corrupt(store.load("s").await, "history recorded at event 4 of session 's'");
                    assert_eq!(whole_log(&store, "s").await, log);
                }
                assert_eq!(
                    raw_stored(&path, column, &row),
                    damaged,
                    "reading left {column} as it was (length {wrong})"
                );
            }
            set_raw(&conn, column, &row, &original);
        }
        assert_eq!(store.load("s").await.expect("load"), state);
        assert_eq!(whole_log(&store, "s").await, log);
        assert_eq!(log_rows(&path, "s"), rows);
    })
    .await;
}

// ---------------------------------------------------------------------------
// 6. Disk full
// ---------------------------------------------------------------------------

#[tokio::test]
async fn full_database_refuses_whole_batches_keeps_earlier_events_and_recovers_without_the_cap() {
    guarded(async {
        let (_dir, path) = database();
        let capped = SqliteOptions {
            max_size_bytes: Some(256 * 1024),
            ..SqliteOptions::default()
        };
        let store = open_with(&path, capped).await;
        let initial = SessionState {
            checkpoint: checkpoint("full", "bot", 0),
            transcript: vec![user("hello")],
            execution: None,
            last_sequence: 0,
            queued: Vec::new(),
        };
        store
            .save(&initial.checkpoint, &initial.transcript, None)
            .await
            .expect("create");

        // Some events before the trouble.
        let earlier: Vec<Event> = (2_000..2_003).map(bulky_event).collect();
        let mut expected = append(&store, "full", &earlier).await;
        let mut state = initial.clone();
        state.last_sequence = 3;

        // A batch several times the cap, even compressed, with a checkpoint
        // write: the update of the session row fits, the batch's log row
        // cannot.
        let huge: Vec<Event> = (0..1_000).map(bulky_event).collect();
        assert_incompressible_past(&huge, 3 * 256 * 1024);
        let error = store
            .append(
                "full",
                AppendBatch {
 lease: None,
                    events: encode(&huge),
                    checkpoint: Some(CheckpointWrite {
                        checkpoint: checkpoint("full", "bot", 9),
                        transcript_delta: vec![assistant("lost", false)],
                        execution: Some(execution("lost-turn")),
                        history_cut: None,
                    }),
                },
            )
            .await
            .expect_err("a batch past the cap fails");
        assert!(matches!(error, StoreError::Full(_)), "{error:?}");
        assert_eq!(store.load("full").await.expect("load"), Some(state.clone()));
        assert_eq!(whole_log(&store, "full").await, expected);
        assert_eq!(
            raw_count(
                &path,
                "SELECT coalesce(sum(last_sequence - first_sequence + 1), 0) FROM log WHERE session_key = (SELECT key FROM sessions WHERE id = ?1)",
                "full"
            ),
            3
        );
        let mut rows = vec![log_row(1, &[user("hello")], &[]), log_row(1, &[], &earlier)];
        assert_eq!(log_rows(&path, "full"), rows, "no row of the refused batch");

        // Its first event alone fits, so the batch failed partway through
        // its writes (after the session row was updated) for want of room.
        expected.extend(append(&store, "full", &huge[..1]).await);
        assert_eq!(expected[3].sequence, 4);
        rows.push(log_row(4, &[], &huge[..1]));
        assert_eq!(log_rows(&path, "full"), rows);

        // Fill up with small batches until the cap refuses one.
        let mut next = huge.len();
        let error = loop {
            let sent: Vec<Event> = (next..next + 5).map(bulky_event).collect();
            next += 5;
            match store.append("full", batch(&sent)).await {
                Ok(receipt) => {
                    assert_eq!(receipt.first_sequence, expected.len() as u64 + 1);
                    expected.extend(recorded(receipt, &sent));
                }
                Err(error) => break error,
            }
            assert!(expected.len() < 2_000, "a 256 KiB database never filled up");
        };
        assert!(matches!(error, StoreError::Full(_)), "{error:?}");
        assert!(expected.len() > 10, "the cap left room for some events");

        // Nothing partial: the log is gap-free, matches last_sequence, and
        // holds exactly the acknowledged events.
        let log = whole_log(&store, "full").await;
        assert_gap_free(&log);
        assert_eq!(log, expected);
        state.last_sequence = expected.len() as u64;
        assert_eq!(store.load("full").await.expect("load"), Some(state.clone()));
        store.close().await;

        // Without the cap the same file takes writes again, continuing the
        // sequence.
        let store = open(&path).await;
        assert_eq!(whole_log(&store, "full").await, expected);
        let sent: Vec<Event> = (next..next + 50).map(bulky_event).collect();
        let receipt = store.append("full", batch(&sent)).await.expect("append without cap");
        assert_eq!(receipt.first_sequence, expected.len() as u64 + 1);
        expected.extend(recorded(receipt, &sent));
        let log = whole_log(&store, "full").await;
        assert_gap_free(&log);
        assert_eq!(log, expected);
        state.last_sequence = expected.len() as u64;
        assert_eq!(store.load("full").await.expect("load"), Some(state));
        store.close().await;
    })
    .await;
}

#[tokio::test]
async fn a_full_database_in_a_group_leaves_every_job_of_it_whole_or_absent() {
    guarded(async {
        let (_dir, path) = database();
        let capped = SqliteOptions {
            max_size_bytes: Some(256 * 1024),
            ..SqliteOptions::default()
        };
        let store = open_with(&path, capped).await;
        for session_id in ["huge", "small"] {
            create(&store, session_id).await;
        }
        // One job that cannot fit between small ones that can, all queued
        // together. On SQLITE_FULL, SQLite may undo only the failing statement
        // or the whole transaction; either way no job may be left half done.
        let huge: Vec<Event> = (0..1_000).map(bulky_event).collect();
        assert_incompressible_past(&huge, 3 * 256 * 1024);
        let smalls: Vec<Vec<Event>> = (0..4).map(|n| events("small", n * 2, 2)).collect();
        let queued: Vec<(&str, &[Event])> = vec![
            ("small", &smalls[0]),
            ("small", &smalls[1]),
            ("huge", &huge),
            ("small", &smalls[2]),
            ("small", &smalls[3]),
        ];
        let mut writes = Box::pin(join_all(queued.iter().map(|&(session_id, sent)| {
            let store = &store;
            async move { store.append(session_id, batch(sent)).await }
        })));
        submit_all_while_locked(&path, &mut writes).await;
        let outcomes = writes.await;

        match &outcomes[2] {
            Err(StoreError::Full(_)) => {}
            other => panic!("the huge batch: expected Full, got {other:?}"),
        }
        assert_eq!(whole_log(&store, "huge").await, vec![]);
        assert_eq!(last_sequence(&store, "huge").await, 0);
        assert_eq!(log_rows(&path, "huge"), vec![]);

        // Each small batch either committed whole, under the next sequences,
        // or failed with Full and left nothing.
        let mut expected = Vec::new();
        let mut rows = Vec::new();
        let mut refused = Vec::new();
        for (outcome, sent) in [&outcomes[0], &outcomes[1], &outcomes[3], &outcomes[4]]
            .into_iter()
            .zip(&smalls)
        {
            match outcome {
                Ok(receipt) => {
                    assert_eq!(receipt.first_sequence, expected.len() as u64 + 1);
                    rows.push(log_row(receipt.first_sequence, &[], sent));
                    expected.extend(recorded(*receipt, sent));
                }
                Err(StoreError::Full(_)) => refused.push(sent),
                Err(other) => panic!("a small batch: expected success or Full, got {other:?}"),
            }
        }
        let log = whole_log(&store, "small").await;
        assert_gap_free(&log);
        assert_eq!(log, expected);
        assert_eq!(last_sequence(&store, "small").await, expected.len() as u64);
        assert_eq!(log_rows(&path, "small"), rows, "one whole row per committed batch");

        // Retried alone, the refused ones fit.
        for sent in refused {
            let receipt = store.append("small", batch(sent)).await.expect("retry alone");
            rows.push(log_row(receipt.first_sequence, &[], sent));
            expected.extend(recorded(receipt, sent));
        }
        let log = whole_log(&store, "small").await;
        assert_gap_free(&log);
        assert_eq!(log, expected);
        assert_eq!(log.len(), 8);
        assert_eq!(log_rows(&path, "small"), rows);
    })
    .await;
}

// ---------------------------------------------------------------------------
// 7. Files that are not (our) databases
// ---------------------------------------------------------------------------

#[tokio::test]
async fn opening_a_file_that_is_not_a_database_fails_and_leaves_its_bytes_unchanged() {
    guarded(async {
        let (dir, path) = database();
        let bytes = garbage(64 * 1024);
        std::fs::write(&path, &bytes).expect("write garbage");

        for options in [
            SqliteOptions::default(),
            SqliteOptions {
                max_size_bytes: Some(1 << 20),
                ..SqliteOptions::default()
            },
        ] {
            match SqliteCheckpoint::open(&path, options).await {
                Err(StoreError::NotADatabase(_)) => {}
                Err(other) => panic!("expected NotADatabase, got {other:?}"),
                Ok(_) => panic!("opened random bytes as a database"),
            }
            assert!(
                std::fs::read(&path).expect("read back") == bytes,
                "the file is unchanged"
            );
        }
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list directory")
            .map(|entry| entry.expect("entry").file_name())
            .collect();
        assert_eq!(
            names,
            vec![path.file_name().expect("file name").to_owned()],
            "no files left beside it"
        );
    })
    .await;
}

#[tokio::test]
async fn opening_a_database_with_a_newer_schema_fails_and_leaves_it_unchanged() {
    guarded(async {
        for journal_mode in ["WAL", "DELETE"] {
            let (_dir, path) = database();
            let newer = schema::SCHEMA_VERSION + 1;
            {
                let conn = Connection::open(&path).expect("create");
                let _: String = conn
                    .pragma_update_and_check(None, "journal_mode", journal_mode, |row| row.get(0))
                    .expect("journal mode");
                conn.execute_batch("CREATE TABLE future (x); INSERT INTO future VALUES ('from a newer keel');")
                    .expect("schema");
                conn.pragma_update(None, "user_version", newer).expect("user_version");
            }
            let bytes = std::fs::read(&path).expect("read");

            match SqliteCheckpoint::open(&path, SqliteOptions::default()).await {
                Err(StoreError::SchemaTooNew { found, supported }) => {
                    assert_eq!((found, supported), (newer, schema::SCHEMA_VERSION));
                }
                Err(other) => panic!("{journal_mode}: expected SchemaTooNew, got {other:?}"),
                Ok(_) => panic!("{journal_mode}: opened a database from the future"),
            }
            assert!(
                std::fs::read(&path).expect("read back") == bytes,
                "{journal_mode}: the file is unchanged"
            );
            let conn = Connection::open(&path).expect("reopen raw");
            let version: i64 = conn
                .pragma_query_value(None, "user_version", |row| row.get(0))
                .expect("user_version");
            assert_eq!(version, newer);
            let tables: Vec<String> = conn
                .prepare("SELECT name FROM sqlite_master ORDER BY name")
                .expect("prepare")
                .query_map([], |row| row.get(0))
                .expect("query")
                .collect::<Result<_, _>>()
                .expect("tables");
            assert_eq!(tables, vec!["future".to_owned()], "{journal_mode}: no tables added");
        }
    })
    .await;
}

// ---------------------------------------------------------------------------
// 8. Reopen and close
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_reopened_store_counts_commits_from_zero_and_continues_the_log_rows() {
    guarded(async {
        let (_dir, path) = database();
        let store = open(&path).await;
        store
            .save(
                &checkpoint("a", "bot-a", 2),
                &[user("a1"), assistant("a2", true)],
                Some(&execution("turn-7")),
            )
            .await
            .expect("save a");
        append(&store, "a", &events("a", 0, 5)).await;
        append(&store, "a", &events("a", 5, 3)).await;
        store.close().await;
        drop(store);

        let store = open(&path).await;
        assert_eq!(store.writer_stats().commits, 0, "a new store counts from zero");
        store
            .save(&checkpoint("a", "bot-a", 3), &[user("a3")], None)
            .await
            .expect("save a");
        store.close().await;

        // The history went on where it stopped: the save after the reopen
        // is a row at the sequence after the last event.
        assert_eq!(
            log_rows(&path, "a"),
            vec![
                log_row(1, &[user("a1"), assistant("a2", true)], &[]),
                log_row(1, &[], &events("a", 0, 5)),
                log_row(6, &[], &events("a", 5, 3)),
                log_row(9, &[user("a3")], &[]),
            ]
        );
    })
    .await;
}

#[tokio::test]
async fn close_folds_the_wal_into_the_database() {
    guarded(async {
        let (_dir, path) = database();
        let store = open(&path).await;
        create(&store, "s").await;
        append(&store, "s", &events("s", 0, 20)).await;
        // Exercise the reader pool so that idle readers are open at close.
        let _ = store.load("s").await.expect("load");
        let _ = whole_log(&store, "s").await;
        let _ = store.list_sessions(10).await.expect("list");
        assert!(wal_path(&path).exists(), "WAL mode while open");

        store.close().await;
        let wal = wal_path(&path);
        assert!(
            !wal.exists() || std::fs::metadata(&wal).expect("wal metadata").len() == 0,
            "the WAL is folded into the database on close"
        );
        // Closing again is harmless, and the data is all there.
        store.close().await;
        let reopened = open(&path).await;
        assert_eq!(last_sequence(&reopened, "s").await, 20);
        reopened.close().await;
    })
    .await;
}

#[tokio::test]
async fn close_finishes_the_writes_already_queued() {
    guarded(async {
        let (_dir, path) = database();
        let store = open(&path).await;
        let sessions: Vec<String> = (0..16).map(|n| format!("q-{n:02}")).collect();
        for session_id in &sessions {
            create(&store, session_id).await;
        }
        let mut writes = Box::pin(join_all(sessions.iter().map(|session_id| {
            let store = &store;
            async move { store.append(session_id, batch(&events(session_id, 0, 3))).await }
        })));
        // Queue every write, then close while they are queued.
        submit_all_while_locked(&path, &mut writes).await;
        store.close().await;
        for outcome in writes.await {
            assert_eq!(outcome.expect("queued write completes").first_sequence, 1);
        }

        let store = open(&path).await;
        for session_id in &sessions {
            assert_eq!(whole_log(&store, session_id).await.len(), 3, "{session_id}");
        }
        store.close().await;
    })
    .await;
}

// ---------------------------------------------------------------------------
// 9. Damaged ranges and the WAL
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_row_whose_sequence_range_is_damaged_reads_as_corrupt_not_as_missing_events() {
    guarded(async {
        let (_dir, path) = database();
        let store = open(&path).await;
        store.save(&checkpoint("s", "bot", 1), &[], None).await.expect("create");
        for first in [0, 2, 4] {
            append(&store, "s", &events("s", first, 2)).await;
        }
        // The row of events 3 and 4 now claims to end before it starts,
        // which a batch without events (last = first - 1) never does.
        raw(&path)
            .execute(
                "UPDATE log SET last_sequence = 0 WHERE session_key = (SELECT key FROM sessions WHERE id = 's')
                 AND first_sequence = 3",
                [],
            )
            .expect("damage the range");
        assert_corrupt(
            store
                .event_page(
                    "s",
                    EventPageRequest {
                        before_sequence: None,
                        limit: 10,
                    },
                )
                .await,
            "events 3 to 0 of session 's'",
        );
    })
    .await;
}

#[tokio::test]
async fn the_wal_is_checkpointed_in_the_background_and_stays_bounded() {
    guarded(async {
        let (_dir, path) = database();
        let store = open(&path).await;
        store.save(&checkpoint("s", "bot", 1), &[], None).await.expect("create");
        // About 48 MiB of incompressible events in 100 KiB batches: far past
        // the 1000 pages that call for a background checkpoint, and past
        // the 32 MiB at which the writer checkpoints itself.
        let mut written = Vec::new();
        for round in 0..480 {
            let sent: Vec<Event> = (round * 100..(round + 1) * 100).map(bulky_event).collect();
            written.extend(append(&store, "s", &sent).await);
        }
        // The checkpointer runs beside the writer; it must have run by now
        // or soon (the hang guard bounds the wait).
        while store.writer_stats().checkpoints == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let wal = std::fs::metadata(path.with_extension("sqlite3-wal")).map_or(0, |meta| meta.len());
        assert!(wal <= 40 * 1024 * 1024, "the WAL grew to {wal} bytes");
        assert_eq!(whole_log(&store, "s").await, written);
    })
    .await;
}

// ---------------------------------------------------------------------------
// 10. Databases of older versions
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_version_1_database_is_migrated_and_keeps_its_sessions() {
    guarded(async {
        let (_dir, path) = database();
        {
            let store = open(&path).await;
            create(&store, "old").await;
            append(&store, "old", &events("old", 0, 3)).await;
            store.close().await;
        }
        {
            // Back to what a version 1 build wrote.
            let conn = Connection::open(&path).expect("raw");
            conn.execute_batch(UNDO_VERSION_7).expect("downgrade to 6");
            conn.execute_batch(
                "ALTER TABLE sessions DROP COLUMN lease_expires_at; ALTER TABLE sessions DROP COLUMN lease_owner;
                 ALTER TABLE log DROP COLUMN history_cut; ALTER TABLE sessions DROP COLUMN title;
                 DROP INDEX sessions_by_bot; ALTER TABLE sessions DROP COLUMN bot_id;
                 DROP TABLE queued_submissions; DROP TABLE submission_keys; PRAGMA user_version = 1;",
            )
            .expect("downgrade");
        }
        let store = open(&path).await;
        let state = store.load("old").await.expect("load").expect("old");
        assert_eq!((state.last_sequence, state.queued.len()), (3, 0));
        assert_eq!(store.keyed_submission("old", "k").await.expect("keys table"), None);
        let conn = Connection::open(&path).expect("raw");
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .expect("user_version");
        assert_eq!(version, schema::SCHEMA_VERSION);
    })
    .await;
}

#[tokio::test]
async fn a_version_2_database_gets_each_sessions_bot_from_its_checkpoint() {
    guarded(async {
        let (_dir, path) = database();
        {
            let store = open(&path).await;
            for (id, bot) in [("first", "bot-a"), ("second", "bot-b"), ("third", "bot-a")] {
                store.save(&checkpoint(id, bot, 0), &[], None).await.expect("create");
                append(&store, id, &events(id, 0, 2)).await;
            }
            store.close().await;
        }
        {
            // Back to what a version 2 build wrote, with one checkpoint
            // damaged: the migration must not fail on it.
            let conn = Connection::open(&path).expect("raw");
            conn.execute_batch(UNDO_VERSION_7).expect("downgrade to 6");
            conn.execute_batch(
                "ALTER TABLE sessions DROP COLUMN lease_expires_at; ALTER TABLE sessions DROP COLUMN lease_owner;
                 ALTER TABLE log DROP COLUMN history_cut; ALTER TABLE sessions DROP COLUMN title;
                 DROP INDEX sessions_by_bot; ALTER TABLE sessions DROP COLUMN bot_id;
                 UPDATE sessions SET checkpoint = 'not json' WHERE id = 'second';
                 PRAGMA user_version = 2;",
            )
            .expect("downgrade");
        }
        let store = open(&path).await;
        let page = store
            .list_sessions_page(None, 10, crate::SessionFilter::bot(Some("bot-a")))
            .await
            .expect("bot-a");
        assert_eq!(page_ids(page), ["third", "first"]);
        let page = store
            .list_sessions_page(None, 10, crate::SessionFilter::bot(Some("bot-b")))
            .await
            .expect("bot-b");
        assert_eq!(
            page_ids(page),
            Vec::<String>::new(),
            "a damaged checkpoint is listed under no bot"
        );
        let state = store.load("first").await.expect("load").expect("first");
        assert_eq!(state.last_sequence, 2);
        // Written again, a session's bot column follows its checkpoint.
        store
            .save(&checkpoint("second", "bot-b", 1), &[], None)
            .await
            .expect("repair");
        let page = store
            .list_sessions_page(None, 10, crate::SessionFilter::bot(Some("bot-b")))
            .await
            .expect("bot-b");
        assert_eq!(page_ids(page), ["second"]);
    })
    .await;
}

/// A failed write or fsync, or a file turned read-only, is the file's
/// fault, not the request's: `Unavailable` (a `503` to clients), retried
/// once it clears; a full disk is `Full`. (The fault tests under
/// `tests/suite/store_faults.rs` cause the write and read-only failures for
/// real; this kernel offers no way to fail an fsync.)
#[test]
fn io_errors_are_unavailable_and_a_full_disk_is_full() {
    use rusqlite::ffi;
    let failure = |code| super::sqlite_error(rusqlite::Error::SqliteFailure(ffi::Error::new(code), None));
    for code in [
        ffi::SQLITE_IOERR_WRITE,
        ffi::SQLITE_IOERR_FSYNC,
        ffi::SQLITE_IOERR_SHMMAP,
        ffi::SQLITE_READONLY,
    ] {
        let error = failure(code);
        assert!(matches!(error, StoreError::Unavailable(_)), "{code}: {error:?}");
    }
    assert!(matches!(failure(ffi::SQLITE_FULL), StoreError::Full(_)));
    assert!(matches!(failure(ffi::SQLITE_CONSTRAINT), StoreError::Backend(_)));
}
