//! I/O errors on write and fsync under the SQLite store, injected by
//! `keel_testing::faulty_vfs` (no root, no special file system needed).
//!
//! What the store guarantees, and these tests check:
//! - a commit that hits an I/O error fails with
//!   [`StoreError::Unavailable`] (a `503` in the server), never a panic or
//!   [`StoreError::Corrupt`]; the session's recorder stops, so the runtime
//!   does not go on as if its events were durable;
//! - nothing acknowledged is lost, and every event a subscriber saw is
//!   stored, with the same content at the same sequence;
//! - a commit that returned an error has an unknown outcome: after a
//!   restart its events may be stored or not, but all of them or none, and
//!   every session's log stays gap-free with no sequence twice. A later
//!   successful commit never builds on the failed one (the "fsyncgate"
//!   trap): it is stored at the sequence its receipt gave, whatever became
//!   of the failed one;
//! - once the fault clears, the same open store takes writes again, and
//!   so does the store reopened as after a restart; `PRAGMA
//!   integrity_check` says `ok`.
//! - a checkpoint that fails on the database file leaves the WAL, and so
//!   every acknowledged event, in place.
//!
//! The VFS fails the call and leaves the file alone; it does not model a
//! kernel that drops the dirty pages of a failed `fsync`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use keel::agent::SubmitOptions;
use keel::protocol::{Event, EventMsg, WarningEvent};
use keel::store::CheckpointStoreExt;
use keel::store::{
    AppendBatch, AppendReceipt, Checkpoint, CheckpointStore, EncodedEvent, SqliteCheckpoint, SqliteOptions, StoreError,
};
use keel::{Agent, Error, RecordedEvent};
use keel_testing::faulty_vfs::{self, FaultOp, FaultRule};

use crate::suite::support::{agent::*, events::*, model::*, store::*, wait::*};

/// Sessions running turns at once (their commits share fsyncs).
const SESSIONS: usize = 4;

/// Turns each session may run before the fault must have stopped it.
const MAX_TURNS: usize = 200;

/// A store on `db` whose connections go through the injecting VFS.
async fn faulty_store(db: &TestDb) -> Arc<SqliteCheckpoint> {
    faulty_vfs::register().expect("register the injecting VFS");
    let options = SqliteOptions {
        vfs: Some(faulty_vfs::VFS_NAME.to_owned()),
        ..SqliteOptions::default()
    };
    Arc::new(
        guard("open the store", SqliteCheckpoint::open(db.path(), options))
            .await
            .expect("open the store through the injecting VFS"),
    )
}

/// A store through the injecting VFS holding one empty session, "s".
async fn faulty_store_with_session(db: &TestDb) -> Arc<SqliteCheckpoint> {
    let store = faulty_store(db).await;
    guard("save", store.save(&Checkpoint::empty("s"), &[], None))
        .await
        .expect("create the session");
    store
}

/// What one session's driver saw.
#[derive(Default)]
struct Run {
    /// Submissions acknowledged: id and the sequence of its
    /// `submission_queued` event.
    acknowledged: Vec<(String, u64)>,
    /// Every event the subscriber received.
    seen: Vec<RecordedEvent>,
    /// The error that stopped the driver, if any.
    error: Option<Error>,
}

/// Reads events until the turn that took `submission_id` ends; `false` if
/// the stream ended first. Messages queued together run as one turn, whose
/// events carry the first one's id: a turn took this submission once its
/// user message is recorded.
async fn read_turn_of(agent: &mut Agent, submission_id: &str, seen: &mut Vec<RecordedEvent>) -> bool {
    let mut taken = false;
    while let Some(event) = guard("next_event", agent.next_event()).await {
        let ours = event.submission_id.as_deref() == Some(submission_id);
        taken |= ours && matches!(event.msg, EventMsg::UserMessage(_));
        let done = event.msg.ends_turn() && (ours || taken);
        seen.push(event);
        if done {
            return true;
        }
    }
    false
}

/// Runs turns until a submission fails or the event stream ends; counts
/// completed turns in `turns`. Then checks that the stopped session
/// refuses a new submission.
async fn drive(mut agent: Agent, name: usize, turns: Arc<AtomicU64>) -> Run {
    let handle = agent.handle();
    let mut run = Run::default();
    for turn in 0..MAX_TURNS {
        let text = format!("session {name} message {turn}");
        match guard(
            "submit_durable",
            handle.submit_durable(user(&text), SubmitOptions::default()),
        )
        .await
        {
            Ok(accepted) => run
                .acknowledged
                .push((accepted.submission_id.clone(), accepted.sequence)),
            Err(error) => {
                run.error = Some(error);
                break;
            }
        }
        let Some((id, _)) = run.acknowledged.last().cloned() else {
            break;
        };
        if !read_turn_of(&mut agent, &id, &mut run.seen).await {
            break;
        }
        turns.fetch_add(1, Ordering::SeqCst);
    }
    // Whatever stopped it, the session must not accept more as if durable.
    let after = guard(
        "submit after the fault",
        handle.submit_durable(user("after the fault"), SubmitOptions::default()),
    )
    .await;
    assert!(
        after.is_err(),
        "session {name}: a stopped session acknowledged a submission: {after:?}"
    );
    if run.error.is_none() {
        run.error = after.err();
    }
    drop(handle);
    let _ = guard("drop the stopped agent", agent.shutdown()).await;
    run
}

/// Whether `error` is how an I/O error of the store may reach a caller:
/// the store's `Unavailable`, or the stopped recorder naming it.
fn is_io_failure(error: &Error) -> bool {
    match error {
        Error::Checkpoint(StoreError::Unavailable(_)) => true,
        Error::Stopped(reason) => reason.contains("cannot be written"),
        _ => false,
    }
}

/// The checks after a fault, on a store reopened as after a restart:
/// integrity, gap-free logs, every acknowledged submission and every seen
/// event stored as seen.
async fn assert_intact(db: &TestDb, runs: &BTreeMap<String, Run>) {
    assert_integrity_ok(db.path());
    let store = SqliteCheckpoint::new(db.path()).expect("reopen the store");
    for (session, run) in runs {
        let stored = stored_events(&store, session).await;
        assert_gapless(&stored, 1);
        for (id, sequence) in &run.acknowledged {
            let event = stored
                .get(usize::try_from(*sequence).expect("sequence") - 1)
                .unwrap_or_else(|| panic!("{session}: acknowledged submission {id} at {sequence} is not stored"));
            assert_eq!(
                (event.msg.kind(), event.submission_id.as_deref()),
                ("submission_queued", Some(id.as_str())),
                "{session}: acknowledged submission {id} is not at its sequence {sequence}"
            );
        }
        for seen in &run.seen {
            let stored_event = stored.get(usize::try_from(seen.sequence).expect("sequence") - 1);
            assert_eq!(
                stored_event,
                Some(seen),
                "{session}: an event a subscriber saw is not stored as seen"
            );
        }
    }
    store.close().await;
}

/// Starts one agent per session, lets them run turns, arms `rule` mid-run
/// and waits until every session stopped; returns what each saw.
async fn run_into_fault(db: &TestDb, store: &Arc<SqliteCheckpoint>, rule: FaultRule) -> (BTreeMap<String, Run>, u64) {
    let turns: Vec<Arc<AtomicU64>> = (0..SESSIONS).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let mut drivers = Vec::new();
    for (name, turns) in turns.iter().enumerate() {
        let session = format!("session-{name}");
        let agent = start_session(session_config(db, &session, store, TestModel::chunks(&["one ", "two"]))).await;
        drivers.push((session, tokio::spawn(drive(agent, name, Arc::clone(turns)))));
    }
    // The fault comes in while every session is busy.
    wait_until_async("turns before the fault", HANG_GUARD, async || {
        turns.iter().all(|turns| turns.load(Ordering::SeqCst) >= 2)
    })
    .await;
    let armed = faulty_vfs::arm(rule);
    let mut runs = BTreeMap::new();
    for (session, driver) in drivers {
        let run = guard("a session stops on the fault", driver).await.expect("driver");
        runs.insert(session, run);
    }
    // A write through the same store is refused with a clear error while the
    // fault lasts.
    let refused = guard("rename during the fault", store.rename_session("session-0", "renamed")).await;
    assert!(
        matches!(refused, Err(StoreError::Unavailable(_))),
        "a write during the fault: {refused:?}"
    );
    let injected = armed.disarm();
    (runs, injected)
}

/// Opens `session` on `store`, runs one turn for `text` and shuts it down;
/// the submission acknowledged (id and sequence) and the events seen.
async fn one_turn(
    db: &TestDb,
    session: &str,
    store: &Arc<SqliteCheckpoint>,
    text: &str,
) -> ((String, u64), Vec<RecordedEvent>) {
    let mut agent = start_with(session_config(db, session, store, TestModel::chunks(&["again"]))).await;
    let handle = agent.handle();
    let accepted = guard(text, handle.submit_durable(user(text), SubmitOptions::default()))
        .await
        .unwrap_or_else(|error| panic!("{session}: the store refused a submission {text}: {error}"));
    let mut seen = Vec::new();
    assert!(
        read_turn_of(&mut agent, &accepted.submission_id, &mut seen).await,
        "{session}: the turn {text} did not end"
    );
    drop(handle);
    shutdown(agent).await;
    ((accepted.submission_id, accepted.sequence), seen)
}

/// The I/O fault stops every session with a clear error; nothing
/// acknowledged or seen is lost; the same store works again once the fault
/// clears, and so does the store reopened.
async fn io_fault_under_running_agents(rule: impl FnOnce(&Path) -> FaultRule) {
    let db = TestDb::new();
    let store = faulty_store(&db).await;
    let (mut runs, injected) = run_into_fault(&db, &store, rule(db.workspace())).await;
    assert!(injected > 0, "the fault was never injected");
    for (session, run) in &runs {
        assert!(!run.acknowledged.is_empty(), "{session} ran no turn before the fault");
        let error = run.error.as_ref().expect("every session stopped with an error");
        assert!(is_io_failure(error), "{session} stopped with {error:?}");
    }
    assert!(
        runs.values()
            .any(|run| matches!(run.error, Some(Error::Checkpoint(StoreError::Unavailable(_))))),
        "no caller saw StoreError::Unavailable"
    );

    // The fault cleared: the same open store takes the sessions' turns again.
    for (session, run) in &mut runs {
        let (acknowledged, seen) = one_turn(&db, session, &store, "after the fault cleared").await;
        run.acknowledged.push(acknowledged);
        run.seen.extend(seen);
    }
    guard("close", store.close()).await;
    assert_intact(&db, &runs).await;

    // And after a restart, on SQLite's own VFS.
    let store = db.open();
    for session in runs.keys() {
        one_turn(&db, session, &store, "after the restart").await;
        let stored = stored_events(&store, session).await;
        assert_gapless(&stored, 1);
    }
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsync_errors_stop_running_sessions_lose_nothing_and_clear() {
    io_fault_under_running_agents(|dir| FaultRule::every(FaultOp::Sync, dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_write_errors_mid_transaction_stop_running_sessions_lose_nothing_and_clear() {
    // The first WAL frames of the transaction are written, a later one fails.
    io_fault_under_running_agents(|dir| FaultRule::every(FaultOp::Write, dir).ending_with("-wal").after(2)).await;
}

/// Warning events with the given texts, encoded.
fn warnings(texts: &[&str]) -> (Vec<Event>, Vec<EncodedEvent>) {
    let events: Vec<Event> = texts
        .iter()
        .map(|text| Event {
            submission_id: None,
            msg: EventMsg::Warning(WarningEvent {
                message: (*text).to_owned(),
            }),
        })
        .collect();
    let encoded = events
        .iter()
        .map(|event| EncodedEvent::encode(event).expect("encode"))
        .collect();
    (events, encoded)
}

async fn append(store: &SqliteCheckpoint, texts: &[&str]) -> Result<(AppendReceipt, Vec<Event>), StoreError> {
    let (events, encoded) = warnings(texts);
    let batch = AppendBatch {
        events: encoded,
        checkpoint: None,
        lease: None,
    };
    let receipt = guard("append", store.append("s", batch)).await?;
    Ok((receipt, events))
}

/// The stored events of "s": gap-free from 1, and holding `expected`
/// (acknowledged events by sequence).
async fn assert_log(store: &SqliteCheckpoint, expected: &BTreeMap<u64, Event>) -> Vec<RecordedEvent> {
    let stored = stored_events(store, "s").await;
    assert_gapless(&stored, 1);
    for (sequence, event) in expected {
        let at = stored
            .get(usize::try_from(*sequence).expect("sequence") - 1)
            .map(|recorded| &recorded.event);
        assert_eq!(at, Some(event), "the acknowledged event at {sequence}");
    }
    stored
}

fn acknowledge(expected: &mut BTreeMap<u64, Event>, receipt: AppendReceipt, events: Vec<Event>) {
    for (offset, event) in events.into_iter().enumerate() {
        let sequence = receipt.first_sequence + offset as u64;
        let earlier = expected.insert(sequence, event);
        assert!(earlier.is_none(), "sequence {sequence} was acknowledged twice");
    }
}

/// Copies the database and its WAL (not the shared memory, which a new
/// process rebuilds from the WAL) to `to`: the files as a crash would leave
/// them.
fn crash_copy(db: &TestDb, to: &Path) -> std::path::PathBuf {
    let target = to.join("crashed.sqlite3");
    std::fs::copy(db.path(), &target).expect("copy the database");
    let wal = db.path().with_extension("sqlite3-wal");
    if wal.exists() {
        std::fs::copy(&wal, to.join("crashed.sqlite3-wal")).expect("copy the WAL");
    }
    target
}

/// The fsync-failure trap: a commit whose fsync failed has an unknown
/// outcome, but a later commit that succeeds must not build on it. Its
/// receipt must say where its events are, and they must be there, with no
/// gap, whether the failed commit's events were kept or not: in the same
/// open store, after a clean restart, and in the files as a crash right
/// after would leave them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_after_a_failed_fsync_does_not_build_on_it() {
    let db = TestDb::new();
    let store = faulty_store_with_session(&db).await;
    let mut expected = BTreeMap::new();
    let (receipt, events) = append(&store, &["a1", "a2", "a3"])
        .await
        .expect("append before the fault");
    acknowledge(&mut expected, receipt, events);

    // One fsync of the WAL fails: the commit of B.
    let armed = faulty_vfs::arm(
        FaultRule::every(FaultOp::Sync, db.workspace())
            .ending_with("-wal")
            .times(1),
    );
    let failed = append(&store, &["b1", "b2"]).await;
    assert!(
        matches!(failed, Err(StoreError::Unavailable(_))),
        "a failed fsync is Unavailable: {failed:?}"
    );
    assert_eq!(armed.injected(), 1);

    // What a crash right after the failed commit leaves: B in full or not
    // at all, and A intact.
    let crashed = tempfile::tempdir().expect("temporary directory");
    let crashed_db = crash_copy(&db, crashed.path());
    let copy = SqliteCheckpoint::new(&crashed_db).expect("open the crashed copy");
    let stored = assert_log(&copy, &expected).await;
    assert!(
        stored.len() == 3 || stored.len() == 5,
        "the failed commit is all or nothing: {stored:?}"
    );
    copy.close().await;

    // The next commit succeeds (the fault was for one fsync) and must not
    // count B's sequences as taken.
    let (receipt, events) = append(&store, &["c1", "c2"]).await.expect("append after the fault");
    assert_eq!(armed.disarm(), 1);
    assert_eq!(
        receipt.first_sequence, 4,
        "the commit after the failed one was numbered after it"
    );
    acknowledge(&mut expected, receipt, events);
    let stored = assert_log(&store, &expected).await;
    assert_eq!(stored.len(), 5, "the same store shows the failed commit: {stored:?}");

    // A crash now, and a clean restart, keep exactly A and C.
    let crashed = tempfile::tempdir().expect("temporary directory");
    let crashed_db = crash_copy(&db, crashed.path());
    guard("close", store.close()).await;
    let main_db = db.path();
    for path in [crashed_db.as_path(), main_db.as_path()] {
        assert_integrity_ok(path);
        let reopened = SqliteCheckpoint::new(path).expect("reopen");
        let stored = assert_log(&reopened, &expected).await;
        assert_eq!(stored.len(), 5, "{}: {stored:?}", path.display());
        let (receipt, _) = append(&reopened, &["d1"]).await.expect("append after the restart");
        assert_eq!(receipt.first_sequence, 6);
        reopened.close().await;
    }
}

/// A checkpoint that fails on the database file (here the one at close)
/// must leave the WAL as it was: commits go on meanwhile (they write and
/// sync only the WAL), and the store reopened holds every acknowledged
/// event.
async fn a_failed_checkpoint_loses_nothing(op: FaultOp) {
    let db = TestDb::new();
    let store = faulty_store_with_session(&db).await;
    let mut expected = BTreeMap::new();
    let (receipt, events) = append(&store, &["a1", "a2"]).await.expect("append before the fault");
    acknowledge(&mut expected, receipt, events);

    let main_file = db.path().file_name().expect("file name").to_string_lossy().into_owned();
    let armed = faulty_vfs::arm(FaultRule::every(op, db.workspace()).ending_with(main_file));
    let (receipt, events) = append(&store, &["b1", "b2"]).await.expect("commits touch only the WAL");
    acknowledge(&mut expected, receipt, events);
    guard("close", store.close()).await;
    assert!(
        armed.disarm() >= 1,
        "the checkpoint at close did not reach the database file"
    );

    assert_integrity_ok(db.path());
    let reopened = SqliteCheckpoint::new(db.path()).expect("reopen");
    let stored = assert_log(&reopened, &expected).await;
    assert_eq!(stored.len(), 4);
    reopened.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_whose_fsync_fails_loses_nothing() {
    a_failed_checkpoint_loses_nothing(FaultOp::Sync).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_whose_writes_fail_loses_nothing() {
    a_failed_checkpoint_loses_nothing(FaultOp::Write).await;
}

/// `unsafe` is denied workspace-wide; only the fault-injecting VFS may allow it.
#[test]
fn only_the_fault_injecting_vfs_allows_unsafe_code() {
    let mut allowing = Vec::new();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pending = vec![root.join("src"), root.join("crates")];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs")
                && std::fs::read_to_string(&path)
                    .expect("read a source file")
                    .contains("allow(unsafe_code)")
            {
                allowing.push(
                    path.strip_prefix(env!("CARGO_MANIFEST_DIR"))
                        .expect("inside")
                        .to_owned(),
                );
            }
        }
    }
    assert_eq!(
        allowing,
        [std::path::PathBuf::from("crates/keel-testing/src/faulty_vfs.rs")]
    );
}
