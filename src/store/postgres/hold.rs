//! Who may open sessions of a PostgreSQL database: the same rule as a
//! SQLite file's `ServeLock` (one `keel serve`, or any number of local
//! commands, never both), kept with PostgreSQL's advisory locks.
//!
//! A hold is a connection of its own holding the lock: exclusive for
//! `keel serve`, shared for `keel run`, `chat`, `fork` and `sessions rm`.
//! The lock goes with the connection, so a process that dies lets go at
//! once. The holder's description travels as the connection's
//! `application_name`, where a refused process reads it.
//!
//! Several servers on one database, each owning some sessions under
//! leases, are the multi-node mode still to come; until then a second
//! server is refused, as on SQLite.

use tokio_postgres::Client;

use super::{connect, parse_url, pg_error};
use crate::store::StoreError;

/// The advisory lock's key ("keel" in ASCII), one per database.
const HOLD_KEY: i64 = 0x6b65_656c;

/// A hold on a PostgreSQL database; dropping it lets go.
pub struct PostgresHold {
    client: Client,
    database: String,
}

impl std::fmt::Debug for PostgresHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresHold")
            .field("database", &self.database)
            .finish_non_exhaustive()
    }
}

impl PostgresHold {
    /// `keel serve`'s exclusive hold, described as `holder`; refused with
    /// [`StoreError::Held`] naming who holds the database.
    pub async fn serve(url: &str, holder: &str) -> Result<Self, StoreError> {
        Self::take(url, holder, "pg_try_advisory_lock").await
    }

    /// A local command's shared hold; refused with [`StoreError::Held`]
    /// while a `keel serve` holds the database.
    pub async fn share(url: &str) -> Result<Self, StoreError> {
        Self::take(url, "keel (a local command)", "pg_try_advisory_lock_shared").await
    }

    async fn take(url: &str, holder: &str, function: &str) -> Result<Self, StoreError> {
        let mut config = parse_url(url)?;
        config.application_name(holder);
        let client = connect(&config).await?;
        let database = redact_postgres_url(url);
        let taken: bool = client
            .query_one(&format!("SELECT {function}($1)"), &[&HOLD_KEY])
            .await
            .map_err(pg_error)?
            .get(0);
        if taken {
            return Ok(Self { client, database });
        }
        let holder: Option<String> = client
            .query_opt(
                "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                 WHERE l.locktype = 'advisory' AND l.granted AND l.database = (
                       SELECT oid FROM pg_database WHERE datname = current_database())
                   AND ((l.classid::bigint << 32) | l.objid::bigint) = $1
                   AND l.mode = 'ExclusiveLock'
                 LIMIT 1",
                &[&HOLD_KEY],
            )
            .await
            .map_err(pg_error)?
            .map(|row| row.get(0));
        Err(StoreError::Held {
            database,
            holder: holder.unwrap_or_else(|| "local keel commands".to_owned()),
        })
    }

    /// Records who holds the database now (a server's address, once known).
    pub async fn describe(&self, holder: &str) -> Result<(), StoreError> {
        self.client
            .execute("SELECT set_config('application_name', $1, false)", &[&holder])
            .await
            .map_err(pg_error)?;
        Ok(())
    }
}

/// `url` with its password, if any, replaced by `***`, for messages.
pub fn redact_postgres_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::postgres::TestPostgres;

    #[test]
    fn passwords_are_left_out_of_urls_shown() {
        assert_eq!(
            redact_postgres_url("postgres://keel:hunter2@db:5432/keel?sslmode=disable"),
            "postgres://keel:***@db:5432/keel?sslmode=disable"
        );
        assert_eq!(
            redact_postgres_url("postgres://keel@db/keel"),
            "postgres://keel@db/keel"
        );
        assert_eq!(redact_postgres_url("postgresql://db"), "postgresql://db");
        assert_eq!(redact_postgres_url("host=db user=keel"), "host=db user=keel");
    }

    /// One server or any number of local commands, never both; a dropped
    /// hold lets go at once.
    #[tokio::test]
    async fn one_server_or_local_commands_hold_a_database() {
        let Some(postgres) = TestPostgres::shared() else { return };
        let url = postgres.fresh_database();
        let first = PostgresHold::share(&url).await.expect("a local command");
        let second = PostgresHold::share(&url).await.expect("another local command");
        let refused = PostgresHold::serve(&url, "keel serve (pid 1)").await;
        assert!(matches!(refused, Err(StoreError::Held { .. })), "{refused:?}");
        drop((first, second));
        // A dropped hold's connection closes in the background.
        let server = eventually(|| PostgresHold::serve(&url, "keel serve (pid 2)"))
            .await
            .expect("the server, once the local commands let go");
        server
            .describe("keel serve (pid 2, http://127.0.0.1:1)")
            .await
            .expect("describe");
        match PostgresHold::serve(&url, "keel serve (pid 3)").await {
            Err(StoreError::Held { holder, .. }) => assert_eq!(holder, "keel serve (pid 2, http://127.0.0.1:1)"),
            other => panic!("a second server: {other:?}"),
        }
        assert!(matches!(PostgresHold::share(&url).await, Err(StoreError::Held { .. })));
        drop(server);
        assert!(
            eventually(|| PostgresHold::share(&url)).await.is_ok(),
            "the server's hold was let go"
        );
    }

    /// `take` again until it succeeds, for a few seconds: a dropped hold's
    /// connection closes in the background.
    async fn eventually<F: Future<Output = Result<PostgresHold, StoreError>>>(
        take: impl Fn() -> F,
    ) -> Result<PostgresHold, StoreError> {
        let mut outcome = take().await;
        for _ in 0..250 {
            if outcome.is_ok() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            outcome = take().await;
        }
        outcome
    }
}
