//! API keys: how they are made, and how a request's key is checked without
//! a trip to the store.
//!
//! A key reads `keel_<id>_<secret>`: `id` is 16 lowercase hex digits (the
//! public handle `keel keys list` shows and `keel keys revoke` takes),
//! `secret` is 32 bytes from a CSPRNG in unpadded base64url. The store
//! keeps only the SHA-256 of the secret, in hex.
//!
//! Every node holds all keys in a [`KeyTable`] in memory and polls the
//! store's access revision every [`POLL_EVERY`]: a key made or revoked on
//! any node is reloaded on every node within that interval plus one read
//! of the keys. A request's key is found by its id (public, so the lookup's
//! timing tells nothing secret) and its secret's hash compared with the
//! stored one in constant time; expiry is checked on every request. Use is
//! recorded in memory and written to the store in batches.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use keel_protocol::{ActorKind, StoreError};
use keel_store::{AccessStore, ApiKeyRecord};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::watch;

use super::principal::Principal;
use super::scope::{Scope, Scopes};
use super::{Liveness, now_ms};

/// What every key starts with, so that scanners for leaked secrets and
/// people can tell a Keel key at a glance.
pub const KEY_PREFIX: &str = "keel_";

/// How often each node asks the store whether keys changed.
pub(crate) const POLL_EVERY: Duration = Duration::from_millis(250);

/// How often the times keys were last used are written to the store.
pub(crate) const TOUCH_EVERY: Duration = Duration::from_secs(5);

/// A key just made: the key itself (shown once, never stored) and its
/// record (what the store keeps).
#[derive(Debug, Clone)]
pub struct NewApiKey {
    /// The whole key, `keel_<id>_<secret>`: give it to its holder; it
    /// cannot be shown again.
    pub key: String,
    /// What is stored: the secret's hash, never the secret.
    pub record: ApiKeyRecord,
}

/// Why a key could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeySpecError {
    /// The tenant is empty or has characters a tenant may not.
    #[error("a tenant is 1 to 128 printable ASCII characters other than `%`")]
    Tenant,
    /// The name is empty, too long or has control characters.
    #[error("a key's name is 1 to 128 characters, none of them control characters")]
    Name,
    /// A scope that is not `read`, `submit`, `approve` or `admin`.
    #[error("unknown scope '{0}' (the scopes are read, submit, approve, admin)")]
    Scope(String),
    /// No scope at all.
    #[error("a key needs at least one scope")]
    NoScope,
}

/// Parses scope names (`read`, `submit`, `approve`, `admin`), refusing
/// unknown ones and an empty list.
pub fn parse_scopes<S: AsRef<str>>(names: &[S]) -> Result<Vec<Scope>, KeySpecError> {
    let mut scopes = Vec::new();
    for name in names {
        let name = name.as_ref().trim();
        let scope = Scope::parse(name).ok_or_else(|| KeySpecError::Scope(name.to_owned()))?;
        if !scopes.contains(&scope) {
            scopes.push(scope);
        }
    }
    if scopes.is_empty() {
        return Err(KeySpecError::NoScope);
    }
    scopes.sort();
    Ok(scopes)
}

/// Makes a key for `tenant` with `scopes`, valid until `expires_at_ms` if
/// given: 32 random bytes of secret (the thread's CSPRNG, seeded by the
/// operating system), stored as their SHA-256 only.
pub fn new_api_key(
    tenant: &str,
    name: &str,
    scopes: &[Scope],
    expires_at_ms: Option<u64>,
    now_ms: u64,
) -> Result<NewApiKey, KeySpecError> {
    if !keel_config::valid_tenant(tenant) {
        return Err(KeySpecError::Tenant);
    }
    if name.is_empty() || name.chars().count() > 128 || name.chars().any(char::is_control) {
        return Err(KeySpecError::Name);
    }
    if scopes.is_empty() {
        return Err(KeySpecError::NoScope);
    }
    let mut id = [0u8; 8];
    rand::fill(&mut id);
    let mut secret = [0u8; 32];
    rand::fill(&mut secret);
    let id = hex(&id);
    let secret = URL_SAFE_NO_PAD.encode(secret);
    let record = ApiKeyRecord {
        id: id.clone(),
        tenant: tenant.to_owned(),
        name: name.to_owned(),
        scopes: Scopes::of(scopes.iter().copied())
            .iter()
            .map(|s| s.name().to_owned())
            .collect(),
        hash: hex(&Sha256::digest(secret.as_bytes())),
        created_at_ms: now_ms,
        last_used_at_ms: None,
        expires_at_ms,
        revoked_at_ms: None,
    };
    Ok(NewApiKey {
        key: format!("{KEY_PREFIX}{id}_{secret}"),
        record,
    })
}

/// Splits a presented key into its id and secret, `None` when it does not
/// have a key's shape.
fn split_key(key: &str) -> Option<(&str, &str)> {
    let (id, secret) = key.strip_prefix(KEY_PREFIX)?.split_once('_')?;
    (!id.is_empty() && !secret.is_empty()).then_some((id, secret))
}

/// Whether `token` has the shape of an API key (so it is not tried as a
/// JWT).
pub(crate) fn looks_like_key(token: &str) -> bool {
    token.starts_with(KEY_PREFIX)
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut out, byte| {
            let _ = write!(out, "{byte:02x}");
            out
        })
}

/// A usable key as held in memory.
#[derive(Debug)]
struct Entry {
    tenant: String,
    name: String,
    scopes: Scopes,
    hash: [u8; 32],
    expires_at_ms: Option<u64>,
}

impl Entry {
    /// The entry of a stored key, `None` for a revoked one or one whose
    /// stored hash is not 32 bytes of hex (which no key can match).
    fn of(record: &ApiKeyRecord) -> Option<Self> {
        if record.revoked_at_ms.is_some() {
            return None;
        }
        let mut hash = [0u8; 32];
        if record.hash.len() != 64 {
            return None;
        }
        for (index, byte) in hash.iter_mut().enumerate() {
            *byte = u8::from_str_radix(record.hash.get(index * 2..index * 2 + 2)?, 16).ok()?;
        }
        // Unknown scope names (from a newer version) grant nothing.
        let scopes = Scopes::of(record.scopes.iter().filter_map(|name| Scope::parse(name)));
        Some(Self {
            tenant: record.tenant.clone(),
            name: record.name.clone(),
            scopes,
            hash,
            expires_at_ms: record.expires_at_ms,
        })
    }

    fn live_at(&self, now_ms: u64) -> bool {
        self.expires_at_ms.is_none_or(|at| now_ms < at)
    }
}

/// The keys, as last loaded.
#[derive(Debug, Default)]
struct Loaded {
    /// Usable keys (not revoked; expiry is checked per request), by id.
    live: HashMap<String, Arc<Entry>>,
    /// Whether the store holds any key at all, revoked or expired ones
    /// included (see `Authenticator::open`).
    any: bool,
    /// The store's access revision read before the keys were: a read that
    /// began earlier never replaces this one.
    revision: u64,
}

/// Every node's copy of the keys, kept fresh by [`KeyTable::run`].
pub(crate) struct KeyTable {
    store: Arc<dyn AccessStore>,
    loaded: RwLock<Arc<Loaded>>,
    /// Bumped on every reload, for streams that must end when their key
    /// stops working.
    generation: watch::Sender<u64>,
    /// Keys used since the last batch was written: id → last use (ms).
    used: Mutex<HashMap<String, u64>>,
}

impl KeyTable {
    /// A table over `store`, loaded once before it is returned.
    pub(crate) async fn load(store: Arc<dyn AccessStore>) -> Result<(Arc<Self>, u64), StoreError> {
        let table = Arc::new(Self {
            store,
            loaded: RwLock::new(Arc::new(Loaded::default())),
            generation: watch::Sender::new(0),
            used: Mutex::new(HashMap::new()),
        });
        let revision = table.store.access_revision().await?;
        table.reload().await?;
        Ok((table, revision))
    }

    /// Reads every key from the store and swaps the table, unless a
    /// reload that began later swapped it first (the poller's read, begun
    /// before a key was made, must not put back a table without it).
    pub(crate) async fn reload(&self) -> Result<(), StoreError> {
        let revision = self.store.access_revision().await?;
        let records = self.store.api_keys().await?;
        let live = records
            .iter()
            .filter_map(|record| Entry::of(record).map(|entry| (record.id.clone(), Arc::new(entry))))
            .collect();
        let loaded = Arc::new(Loaded {
            live,
            any: !records.is_empty(),
            revision,
        });
        if let Ok(mut slot) = self.loaded.write() {
            if slot.revision > revision {
                return Ok(());
            }
            *slot = loaded;
        }
        self.generation.send_modify(|generation| *generation += 1);
        Ok(())
    }

    fn current(&self) -> Arc<Loaded> {
        self.loaded.read().map(|loaded| Arc::clone(&loaded)).unwrap_or_default()
    }

    /// Whether the store holds any key at all (revoked ones included).
    pub(crate) fn any(&self) -> bool {
        self.current().any
    }

    /// The principal of `key` when it is a live key, `None` otherwise (the
    /// reason is logged at debug level only).
    pub(crate) fn check(self: &Arc<Self>, key: &str, now_ms: u64) -> Option<(Principal, Liveness)> {
        let Some((id, secret)) = split_key(key) else {
            tracing::debug!("refused a key: not of a key's shape");
            return None;
        };
        let loaded = self.current();
        let Some(entry) = loaded.live.get(id) else {
            tracing::debug!(key_id = id, "refused a key: unknown or revoked");
            return None;
        };
        let given = Sha256::digest(secret.as_bytes());
        if !bool::from(given.as_slice().ct_eq(&entry.hash)) {
            tracing::debug!(key_id = id, "refused a key: wrong secret");
            return None;
        }
        if !entry.live_at(now_ms) {
            tracing::debug!(key_id = id, "refused a key: expired");
            return None;
        }
        if let Ok(mut used) = self.used.lock() {
            // A key used again before the batch is written costs no allocation.
            match used.get_mut(id) {
                Some(at) => *at = now_ms,
                None => {
                    used.insert(id.to_owned(), now_ms);
                }
            }
        }
        let principal = Principal::of_tenant(
            &entry.tenant,
            id,
            ActorKind::ApiKey,
            Some(entry.name.clone()),
            entry.scopes,
        );
        let liveness = Liveness::Key {
            table: Arc::clone(self),
            id: id.to_owned(),
        };
        Some((principal, liveness))
    }

    /// Whether key `id` still works at `now_ms`, and until when at most.
    fn state(&self, id: &str, now_ms: u64) -> Option<Option<u64>> {
        let loaded = self.current();
        let entry = loaded.live.get(id)?;
        entry.live_at(now_ms).then_some(entry.expires_at_ms)
    }

    /// Resolves once key `id` is revoked or expired (or the table is gone).
    pub(crate) async fn ended(&self, id: &str) {
        let mut generations = self.generation.subscribe();
        loop {
            let Some(expires_at_ms) = self.state(id, now_ms()) else {
                return;
            };
            let until_expiry = expires_at_ms.map(|at| Duration::from_millis(at.saturating_sub(now_ms())));
            tokio::select! {
                changed = generations.changed() => if changed.is_err() { return },
                () = sleep_or_forever(until_expiry) => {}
            }
        }
    }

    /// Polls the store's revision and reloads the keys when it moved;
    /// writes the batch of last uses every [`TOUCH_EVERY`]. Runs until the
    /// server stops (errors are logged and retried at the next tick).
    pub(crate) async fn run(self: Arc<Self>, mut revision: u64) {
        let mut poll = tokio::time::interval(POLL_EVERY);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut touch = tokio::time::interval(TOUCH_EVERY);
        touch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = poll.tick() => match self.store.access_revision().await {
                    Ok(now) if now != revision => match self.reload().await {
                        Ok(()) => revision = now,
                        Err(error) => tracing::warn!(%error, "could not reload the API keys"),
                    },
                    Ok(_) => {}
                    Err(error) => tracing::warn!(%error, "could not read the access revision"),
                },
                _ = touch.tick() => self.flush_uses().await,
            }
        }
    }

    /// Writes the last uses recorded since the previous batch.
    pub(crate) async fn flush_uses(&self) {
        let batch: Vec<(String, u64)> = match self.used.lock() {
            Ok(mut used) => used.drain().collect(),
            Err(_) => return,
        };
        if batch.is_empty() {
            return;
        }
        if let Err(error) = self.store.touch_api_keys(&batch).await {
            tracing::warn!(%error, "could not record when API keys were last used");
        }
    }
}

async fn sleep_or_forever(duration: Option<Duration>) {
    match duration {
        Some(duration) => tokio::time::sleep(duration).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_long_random_and_stored_as_a_hash_only() {
        let made = new_api_key("acme", "ci", &[Scope::Read, Scope::Submit], None, 1_000).expect("key");
        let (id, secret) = split_key(&made.key).expect("shape");
        assert_eq!(id, made.record.id);
        assert_eq!(id.len(), 16);
        assert!(secret.len() >= 43, "32 bytes of secret");
        assert!(!made.record.hash.contains(secret));
        assert_eq!(made.record.hash, hex(&Sha256::digest(secret.as_bytes())));
        assert_eq!(made.record.scopes, ["read", "submit"]);
        let other = new_api_key("acme", "ci", &[Scope::Read], None, 1_000).expect("key");
        assert_ne!(made.key, other.key);
        assert_ne!(made.record.id, other.record.id);

        assert_eq!(
            new_api_key("", "ci", &[Scope::Read], None, 0).err(),
            Some(KeySpecError::Tenant)
        );
        assert_eq!(
            new_api_key("a%b", "ci", &[Scope::Read], None, 0).err(),
            Some(KeySpecError::Tenant)
        );
        // The one grammar of tenant names: what a session or a JWT may name.
        assert!(new_api_key("org:42", "ci", &[Scope::Read], None, 0).is_ok());
        assert_eq!(
            new_api_key("t\u{e9}", "ci", &[Scope::Read], None, 0).err(),
            Some(KeySpecError::Tenant)
        );
        assert_eq!(
            new_api_key("a", "", &[Scope::Read], None, 0).err(),
            Some(KeySpecError::Name)
        );
        assert_eq!(
            new_api_key("a", "a\u{85}", &[Scope::Read], None, 0).err(),
            Some(KeySpecError::Name)
        );
        assert_eq!(new_api_key("a", "n", &[], None, 0).err(), Some(KeySpecError::NoScope));
        assert_eq!(
            parse_scopes(&["admin", "read", "read"]),
            Ok(vec![Scope::Read, Scope::Admin])
        );
        assert_eq!(parse_scopes(&["root"]), Err(KeySpecError::Scope("root".into())));
        assert_eq!(parse_scopes::<&str>(&[]), Err(KeySpecError::NoScope));
        assert_eq!(split_key("keel_abc"), None);
        assert_eq!(split_key("keel__x"), None);
        assert_eq!(split_key("other_a_b"), None);
    }

    #[test]
    fn a_revoked_or_malformed_record_is_no_entry() {
        let made = new_api_key("acme", "ci", &[Scope::Read], Some(2_000), 1_000).expect("key");
        let entry = Entry::of(&made.record).expect("entry");
        assert!(entry.live_at(1_999) && !entry.live_at(2_000));
        let mut revoked = made.record.clone();
        revoked.revoked_at_ms = Some(1_500);
        assert!(Entry::of(&revoked).is_none());
        let mut bad = made.record;
        bad.hash = "zz".repeat(32);
        assert!(Entry::of(&bad).is_none());
    }
}
