//! The databases' own checks of their files, run at the end of a chaos
//! run: whatever the faults did, the store must not be corrupt.

use std::path::Path;

/// SQLite's own check of the file.
pub(super) fn integrity(path: &Path, violations: &mut Vec<String>) {
    let verdict = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .and_then(|conn| conn.query_row("PRAGMA integrity_check", [], |row| row.get::<_, String>(0)));
    match verdict {
        Ok(verdict) if verdict == "ok" => {}
        Ok(verdict) => violations.push(format!("the database's integrity check says: {verdict}")),
        Err(error) => violations.push(format!("the database cannot be checked: {error}")),
    }
}

/// PostgreSQL's own checks (`amcheck`): every B-tree index of the database
/// is consistent and finds every row of its table, and no table has a
/// corrupt page. A check that cannot run is a violation too.
pub(super) async fn postgres_integrity(url: &str, violations: &mut Vec<String>) {
    const INDEXES: &str = "SELECT c.oid::regclass::text FROM pg_class c
         JOIN pg_am am ON am.oid = c.relam JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.relkind = 'i' AND am.amname = 'btree' AND n.nspname = 'public'";
    const TABLES: &str = "SELECT c.oid::regclass::text FROM pg_class c
         JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.relkind = 'r' AND n.nspname = 'public'";
    let checked = async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        let driver = tokio::spawn(connection);
        client.batch_execute("CREATE EXTENSION IF NOT EXISTS amcheck").await?;
        let mut found = Vec::new();
        for row in client.query(INDEXES, &[]).await? {
            let index: String = row.try_get(0)?;
            if let Err(error) = client
                .execute("SELECT bt_index_check($1::text::regclass, true)", &[&index])
                .await
            {
                found.push(format!("the index {index} fails its check: {error}"));
            }
        }
        let tables = client.query(TABLES, &[]).await?;
        for row in &tables {
            let table: String = row.try_get(0)?;
            for corrupt in client
                .query(
                    "SELECT blkno, offnum, msg FROM verify_heapam($1::text::regclass)",
                    &[&table],
                )
                .await?
            {
                let (block, offset, message): (i64, Option<i32>, String) =
                    (corrupt.try_get(0)?, corrupt.try_get(1)?, corrupt.try_get(2)?);
                found.push(format!(
                    "the table {table} is corrupt at block {block}, item {offset:?}: {message}"
                ));
            }
        }
        if tables.is_empty() {
            found.push("no table of Keel's was found to check".to_owned());
        }
        drop(client);
        let _ = driver.await;
        Ok::<_, tokio_postgres::Error>(found)
    };
    match checked.await {
        Ok(found) => violations.extend(found),
        Err(error) => violations.push(format!("the database cannot be checked: {error}")),
    }
}
