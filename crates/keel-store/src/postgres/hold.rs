//! Who may open sessions of a PostgreSQL database: any number of `keel
//! serve` nodes, or any number of local commands, never both. Nodes share
//! the sessions under leases; a local command would take sessions from
//! under them.
//!
//! A hold is a connection of its own holding a shared advisory lock, on one
//! key for servers and another for local commands, then checking that
//! nobody holds the other key. Two processes of opposite kinds starting at
//! once may both be refused, never both admitted: each takes its lock
//! before it looks for the other's. The lock goes with the connection, so a
//! process that dies lets go at once. The holder's description travels as
//! the connection's `application_name`, where a refused process reads it.

use tokio_postgres::Client;

use super::{connect, parse_url, pg_error};
use crate::StoreError;

/// The directories holding the Unix sockets a `postgres://` URL connects
/// through (its `host`s that are paths), so that the sandbox can cover them.
/// A URL that does not parse names none (connecting to it fails anyway).
pub fn socket_directories(url: &str) -> Vec<std::path::PathBuf> {
    let Ok(config) = url.parse::<tokio_postgres::Config>() else {
        return Vec::new();
    };
    config
        .get_hosts()
        .iter()
        .filter_map(|host| match host {
            tokio_postgres::config::Host::Unix(directory) => Some(directory.clone()),
            tokio_postgres::config::Host::Tcp(_) => None,
        })
        .collect()
}

/// The servers' advisory lock key ("keel" in ASCII), one per database.
const SERVE_KEY: i64 = 0x6b65_656c;

/// The local commands' advisory lock key ("keeL").
const LOCAL_KEY: i64 = 0x6b65_654c;

/// The namespace of the node-id locks (the first half of a two-key
/// advisory lock; the second is the id's hash).
const NODE_NAMESPACE: i32 = 0x6b65_6e64;

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
    /// A `keel serve` node's hold, described as `holder`, shared with the
    /// other nodes; refused with [`StoreError::Held`] while local commands
    /// have the database open, and with [`StoreError::Invalid`] while a
    /// live node has the id `node_id`: two runtimes under one owner id
    /// would both hold its leases.
    pub async fn serve(url: &str, holder: &str, node_id: &str) -> Result<Self, StoreError> {
        let hold = Self::take(url, holder, SERVE_KEY, LOCAL_KEY).await?;
        let unique: bool = hold
            .client
            .query_one(
                "SELECT pg_try_advisory_lock($1, hashtext($2))",
                &[&NODE_NAMESPACE, &node_id],
            )
            .await
            .map_err(pg_error)?
            .get(0);
        if !unique {
            return Err(StoreError::Invalid(format!(
                "node id '{node_id}' is in use by a running node of {} (or one whose id hashes alike); give this one another --node-id",
                hold.database
            )));
        }
        Ok(hold)
    }

    /// A local command's hold, shared with other local commands; refused
    /// with [`StoreError::Held`], naming a server, while any serves it.
    pub async fn share(url: &str) -> Result<Self, StoreError> {
        Self::take(url, "keel (a local command)", LOCAL_KEY, SERVE_KEY).await
    }

    async fn take(url: &str, holder: &str, own: i64, other: i64) -> Result<Self, StoreError> {
        let mut config = parse_url(url)?;
        config.application_name(holder);
        let client = connect(&config).await?;
        let database = redact_postgres_url(url);
        let taken: bool = client
            .query_one("SELECT pg_try_advisory_lock_shared($1)", &[&own])
            .await
            .map_err(pg_error)?
            .get(0);
        // Only a server's exclusive hold of an older Keel refuses a shared one.
        let holder = if taken {
            client
                .query_opt(
                    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                     WHERE l.locktype = 'advisory' AND l.granted AND l.database = (
                           SELECT oid FROM pg_database WHERE datname = current_database())
                       AND ((l.classid::bigint << 32) | l.objid::bigint) = $1
                     ORDER BY a.backend_start LIMIT 1",
                    &[&other],
                )
                .await
                .map_err(pg_error)?
                .map(|row| row.get::<_, String>(0))
        } else {
            Some("keel serve".to_owned())
        };
        match holder {
            None => Ok(Self { client, database }),
            Some(holder) => Err(StoreError::Held {
                database,
                holder: if holder.is_empty() || !holder.starts_with("keel") {
                    "local keel commands".to_owned()
                } else {
                    holder
                },
            }),
        }
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

/// The connection parameters that hold a secret: their values are never
/// shown.
const SECRET_KEYS: [&str; 2] = ["password", "sslpassword"];

/// A PostgreSQL connection string with every password in it replaced by
/// `***`, for messages: the password of a URL's user info
/// (`postgres://user:PASSWORD@host`), a `password=` or `sslpassword=` query
/// parameter (`postgres://host/db?password=PASSWORD`), and the same keys of
/// a `key=value` connection string (`host=db password='PASS WORD'`).
/// Anything else is returned as it is.
pub fn redact_postgres_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => format!("{scheme}://{}", redact_url_rest(rest)),
        None => redact_key_values(url),
    }
}

/// The part of a URL after its scheme, redacted.
fn redact_url_rest(rest: &str) -> String {
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{user}:***@{host}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    let Some((path, query)) = tail.split_once('?') else {
        return format!("{authority}{tail}");
    };
    let (query, fragment) = match query.split_once('#') {
        Some((query, fragment)) => (query, Some(fragment)),
        None => (query, None),
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if is_secret(key) => format!("{key}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    let mut shown = format!("{authority}{path}?{}", query.join("&"));
    if let Some(fragment) = fragment {
        shown.push('#');
        shown.push_str(fragment);
    }
    shown
}

fn is_secret(key: &str) -> bool {
    SECRET_KEYS.iter().any(|secret| key.trim().eq_ignore_ascii_case(secret))
}

/// A libpq `key=value` string (`key = value`, values bare or single-quoted
/// with backslash escapes) with the values of secret keys replaced.
fn redact_key_values(text: &str) -> String {
    let mut shown = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        // Spaces between pairs are kept as they are.
        let spaces = rest.len() - rest.trim_start().len();
        shown.push_str(&rest[..spaces]);
        rest = &rest[spaces..];
        let Some(equals) = rest.find('=') else {
            shown.push_str(rest);
            break;
        };
        let key = &rest[..equals];
        if key.trim().contains(char::is_whitespace) {
            // Not a key: a word of something else; keep it and go on.
            let word = rest.find(char::is_whitespace).unwrap_or(rest.len());
            shown.push_str(&rest[..word]);
            rest = &rest[word..];
            continue;
        }
        shown.push_str(&rest[..=equals]);
        rest = &rest[equals + 1..];
        let spaces = rest.len() - rest.trim_start().len();
        shown.push_str(&rest[..spaces]);
        rest = &rest[spaces..];
        let value_end = value_length(rest);
        if is_secret(key) {
            shown.push_str("***");
        } else {
            shown.push_str(&rest[..value_end]);
        }
        rest = &rest[value_end..];
    }
    shown
}

/// The length of the value at the start of `text`: a quoted value through
/// its closing quote, a bare one up to the next space.
fn value_length(text: &str) -> usize {
    let mut chars = text.char_indices();
    if text.starts_with('\'') {
        chars.next();
        let mut escaped = false;
        for (at, char) in chars {
            match char {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '\'' => return at + 1,
                _ => {}
            }
        }
        return text.len();
    }
    text.find(char::is_whitespace).unwrap_or(text.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::local::LocalPostgres;

    #[test]
    fn socket_directories_come_from_the_url() {
        let directories = |url| socket_directories(url);
        assert_eq!(
            directories("postgres://keel@%2Fsrv%2Fkeel-test-sockets/keel"),
            [std::path::PathBuf::from("/srv/keel-test-sockets")]
        );
        assert_eq!(
            directories("postgresql:///keel?host=/run/keel-test-other"),
            [std::path::PathBuf::from("/run/keel-test-other")]
        );
        assert!(directories("postgres://keel@db.example/keel").is_empty());
        assert!(directories("not a url").is_empty());
    }

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

    /// Every form a password takes in a connection string is redacted, and
    /// nothing else is changed.
    #[test]
    fn passwords_in_queries_and_key_value_strings_are_redacted() {
        for (given, shown) in [
            ("postgres://db/keel?password=hunter2", "postgres://db/keel?password=***"),
            (
                "postgresql://keel@db/keel?sslmode=disable&PassWord=hunter2&application_name=x",
                "postgresql://keel@db/keel?sslmode=disable&PassWord=***&application_name=x",
            ),
            (
                "postgres://keel:a@db/keel?sslpassword=hunter2#frag",
                "postgres://keel:***@db/keel?sslpassword=***#frag",
            ),
            ("postgres://db?password=hunter2", "postgres://db?password=***"),
            ("host=db password=hunter2 user=keel", "host=db password=*** user=keel"),
            ("host=db password = hunter2", "host=db password = ***"),
            (
                r"host=db password='hun ter\'2' dbname=keel",
                "host=db password=*** dbname=keel",
            ),
            ("password=hunter2", "password=***"),
            ("host=db sslpassword='x y'", "host=db sslpassword=***"),
            ("host=db user=keel", "host=db user=keel"),
            ("postgres://db/keel?user=keel", "postgres://db/keel?user=keel"),
        ] {
            let redacted = redact_postgres_url(given);
            assert_eq!(redacted, shown, "{given}");
            assert!(
                !redacted.contains("hunter2") && !redacted.contains("hun ter"),
                "{given}"
            );
        }
    }

    /// Any number of servers or any number of local commands, never both;
    /// a dropped hold lets go at once.
    #[tokio::test]
    async fn servers_or_local_commands_hold_a_database_never_both() {
        let Some(postgres) = LocalPostgres::shared() else {
            return;
        };
        let url = postgres.fresh_database();
        let first = PostgresHold::share(&url).await.expect("a local command");
        let second = PostgresHold::share(&url).await.expect("another local command");
        match PostgresHold::serve(&url, "keel serve (pid 1)", "n1").await {
            Err(StoreError::Held { holder, .. }) => assert_eq!(holder, "keel (a local command)"),
            other => panic!("a server beside local commands: {other:?}"),
        }
        drop((first, second));
        // A dropped hold's connection closes in the background.
        let server = eventually(|| PostgresHold::serve(&url, "keel serve (pid 2)", "n2"))
            .await
            .expect("the server, once the local commands let go");
        server
            .describe("keel serve (pid 2, http://127.0.0.1:1)")
            .await
            .expect("describe");
        let node = PostgresHold::serve(&url, "keel serve (pid 3)", "n3")
            .await
            .expect("a second node beside the first");
        match PostgresHold::serve(&url, "keel serve (pid 4)", "n3").await {
            Err(StoreError::Invalid(message)) => assert!(message.contains("node id 'n3' is in use"), "{message}"),
            other => panic!("a second node with one id: {other:?}"),
        }
        match PostgresHold::share(&url).await {
            Err(StoreError::Held { holder, .. }) => assert_eq!(holder, "keel serve (pid 2, http://127.0.0.1:1)"),
            other => panic!("a local command beside servers: {other:?}"),
        }
        drop((server, node));
        assert!(
            eventually(|| PostgresHold::share(&url)).await.is_ok(),
            "the servers' holds were let go"
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
