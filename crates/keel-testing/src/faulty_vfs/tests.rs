use super::*;

#[test]
fn registers_once_and_opens_a_database() {
    assert_eq!(register().expect("register"), VFS_NAME);
    assert_eq!(register().expect("register again"), VFS_NAME);
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("db.sqlite3");
    let conn = rusqlite::Connection::open_with_flags_and_vfs(&path, rusqlite::OpenFlags::default(), VFS_NAME)
        .expect("open through the VFS");
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .expect("WAL");
    assert_eq!(mode, "wal");
    conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
        .expect("write");
    let n: i64 = conn
        .query_row("SELECT count(*) FROM t", [], |row| row.get(0))
        .expect("read");
    assert_eq!(n, 1);
}

#[test]
fn fails_the_next_sync_of_the_wal_only() {
    register().expect("register");
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("db.sqlite3");
    let conn = rusqlite::Connection::open_with_flags_and_vfs(&path, rusqlite::OpenFlags::default(), VFS_NAME)
        .expect("open through the VFS");
    conn.execute_batch("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; CREATE TABLE t (x);")
        .expect("schema");
    let other_dir = tempfile::tempdir().expect("temporary directory");
    let elsewhere = arm(FaultRule::every(FaultOp::Sync, other_dir.path()));
    conn.execute("INSERT INTO t VALUES (1)", [])
        .expect("a fault elsewhere is not ours");
    assert_eq!(elsewhere.disarm(), 0);
    let armed = arm(FaultRule::every(FaultOp::Sync, dir.path()).ending_with("-wal").times(1));
    let error = conn
        .execute("INSERT INTO t VALUES (2)", [])
        .expect_err("the fsync fails");
    assert_eq!(
        error.sqlite_error().map(|error| error.extended_code),
        Some(ffi::SQLITE_IOERR_FSYNC)
    );
    assert_eq!(armed.injected(), 1);
    conn.execute("INSERT INTO t VALUES (3)", [])
        .expect("the next one succeeds");
    assert_eq!(armed.disarm(), 1);
}

#[test]
fn fails_writes_while_armed() {
    register().expect("register");
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("db.sqlite3");
    let conn = rusqlite::Connection::open_with_flags_and_vfs(&path, rusqlite::OpenFlags::default(), VFS_NAME)
        .expect("open through the VFS");
    conn.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t (x);")
        .expect("schema");
    let armed = arm(FaultRule::every(FaultOp::Write, dir.path()));
    for _ in 0..3 {
        let error = conn
            .execute("INSERT INTO t VALUES (1)", [])
            .expect_err("the write fails");
        assert_eq!(
            error.sqlite_error().map(|error| error.extended_code),
            Some(ffi::SQLITE_IOERR_WRITE)
        );
    }
    assert!(armed.disarm() >= 3);
    conn.execute("INSERT INTO t VALUES (2)", [])
        .expect("the write succeeds once cleared");
    let n: i64 = conn
        .query_row("SELECT count(*) FROM t", [], |row| row.get(0))
        .expect("read");
    assert_eq!(n, 1);
}
