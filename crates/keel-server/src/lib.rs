//! `keel serve`: the HTTP API of `docs/http-api.md` over a store of sessions.
//!
//! [`serve`] answers on a listener until its shutdown future resolves, then
//! stops accepting, gives running turns a grace period, interrupts the ones
//! still running and shuts every live session down. Inside, one job per
//! module:
//!
//! - `host`: which sessions are loaded; loading on first use, unloading
//!   when idle, the bound on live sessions, shutdown, and (on several nodes)
//!   leases, take-over and relaying;
//! - `fanout`: each live session's events, published to any number of
//!   subscribers without gaps, duplicates or back-pressure on the agent;
//! - `conn`: accepting connections and bounding what each may hold before
//!   it is authenticated; `front`: the `Host`, `Origin` and body-size
//!   checks that keep other sites' pages out;
//! - `routes`, `sse`, `ws`: the endpoints; `auth`: who a request's
//!   credential is (the operator's token, an API key, a JWT);
//!   `error`: the JSON errors; `settings`: per-session settings;
//!   `ceiling`: what API clients may ask for (`keel.toml`'s `[server]`);
//!   `factory`: how a session is assembled from its settings; `metrics`:
//!   Prometheus metrics; `ui`: the web UI.
//!
//! It must not know which store backend it runs on (no dependency on
//! `tokio-postgres`: it sees the store's neutral notices), which provider a
//! model talks to (no dependency on `keel-providers`), or terminals.

mod auth;
mod budget;
mod ceiling;
mod client_tools;
mod conn;
mod error;
mod extract;
mod factory;
mod fanout;
mod front;
mod frontends;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod host;
mod metrics;
mod openapi;
pub(crate) mod routes;
mod running;
mod script_dir;
mod settings;
mod sse;
mod telemetry;
mod tenant_ceiling;
mod ui;
mod webhooks;
mod ws;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderValue;
use tokio::net::TcpListener;

pub use self::auth::Scope;
pub use self::auth::keys::{KEY_PREFIX, KeySpecError, NewApiKey, new_api_key, parse_scopes};
pub use self::budget::{BudgetClock, Exhausted};
pub use self::conn::{
    DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_HEADER_BYTES, raise_open_file_limit,
};
pub use self::error::ApiError;
use self::factory::SessionFactory;
pub use self::factory::{tenant_workspace_dir, workspace_dir};
pub use self::front::DEFAULT_BODY_TIMEOUT;
pub use self::host::RelayKey;
use self::host::{Host, HostLimits};
use self::metrics::{MeteredStore, Metrics};
pub use self::routes::{openapi_document, openapi_json};
use keel_agent::{DEFAULT_MAX_STEPS, DEFAULT_SUBMISSION_CAPACITY};
use keel_agent::{LeaseClock, LeaseOwner};
use keel_config::KeelConfig;
use keel_store::CheckpointStore;
use keel_store::{AccessStore, ClusterStore, NoticeListener, WebhookStore};

/// The version of the HTTP API (the OpenAPI document's `info.version`):
/// the major changes only with a breaking change to the API.
pub const API_VERSION: &str = "1.5.0";

/// The response header that carries [`API_VERSION`], so that a client can
/// refuse a server of another major version before it misreads an answer.
pub const API_VERSION_HEADER: &str = "keel-api-version";

/// AG-UI threads a node keeps read (each holds its session's message
/// texts), so a run of one of them reads only the events stored since.
const AG_UI_THREADS: usize = 256;

/// The largest request body, by default.
pub const DEFAULT_BODY_LIMIT: usize = 2 * 1024 * 1024;

/// The largest connection bound accepted (far above any open-file limit).
const MAX_CONNECTIONS_BOUND: usize = 1 << 20;

/// Everything a server needs.
pub struct ServerConfig {
    /// Where the sessions live.
    pub store: Arc<dyn CheckpointStore>,
    /// `keel.toml`: named models, `[tools]`, `[approvals]`, `[mcp]`, and
    /// `[server]`, the ceiling on what API clients may ask for.
    pub keel: KeelConfig,
    /// The model of sessions created without one.
    pub default_model: Option<String>,
    /// Each session works in a directory of its own under this one.
    pub workspace_root: PathBuf,
    /// The `keel` binary whose hidden `sandbox-exec` command runs shell
    /// commands under the sandbox; without it the shell is not sandboxed.
    pub launcher: Option<PathBuf>,
    /// The operator's bearer token (every scope on every tenant); required
    /// unless the listener is on loopback. API keys (from `access`) and
    /// JWTs (`keel.auth.jwt`) are the other credentials.
    pub token: Option<String>,
    /// The one origin allowed to call the API from a browser (CORS).
    pub cors_origin: Option<String>,
    /// The most sessions loaded at once.
    pub max_live_sessions: usize,
    /// How long an idle session stays loaded.
    pub idle_unload: Duration,
    /// How long running turns get to finish at shutdown before they are
    /// interrupted.
    pub shutdown_grace: Duration,
    /// The largest request body (and WebSocket message).
    pub body_limit: usize,
    /// Events kept per session for subscribers that fall behind before
    /// they are served from the store instead.
    pub live_buffer: usize,
    /// How often an idle event stream sends a keep-alive comment.
    pub keep_alive: Duration,
    /// The most model calls one turn may make.
    pub max_steps: u32,
    /// Queued submissions a session holds.
    pub submission_capacity: usize,
    /// Host names the server answers for besides its listen address,
    /// `localhost`, `127.0.0.1` and `[::1]` (on any port); requests for any
    /// other `Host` are `421`, which defeats DNS rebinding.
    pub allowed_hosts: Vec<String>,
    /// How long a connection gets to send a complete request head, counted
    /// from when it opens or finished its previous request: also how long
    /// an idle kept-alive connection stays open.
    pub header_timeout: Duration,
    /// How long a request body gets to arrive whole once its head has; a
    /// body still incomplete then is `408` and its connection is closed.
    pub body_timeout: Duration,
    /// The most connections open at once (kept below the open-file limit);
    /// further ones wait to be accepted.
    pub max_connections: usize,
    /// The largest request head (request line and headers); larger is
    /// `431` and the connection is closed.
    pub max_header_bytes: usize,
    /// How often sessions past `[server] retention_days` are looked for.
    pub retention_sweep: Duration,
    /// Several nodes on one (PostgreSQL) database: this node's part in it.
    /// `None` for the only node (SQLite's mode).
    pub cluster: Option<ClusterConfig>,
    /// The store's keys, budgets and usage ledger, on the database of
    /// [`Self::store`]; without it budgets are not enforced.
    pub access: Option<Arc<dyn AccessStore>>,
    /// The clock budgets' rolling days are counted by: the system's,
    /// unless a test moves it.
    pub budget_clock: BudgetClock,
    /// The webhook outbox, on the database of [`Self::store`]: endpoints
    /// (`/v1/webhooks`, `[webhooks.endpoints]`) and their deliveries, which
    /// this node posts; without it there are no webhooks.
    pub webhooks: Option<Arc<dyn WebhookStore>>,
}

/// A node's settings when several share one database.
pub struct ClusterConfig {
    /// This node's id, unique among the live nodes (it owns leases).
    pub node_id: String,
    /// How long a session's lease lasts without a renewal: how soon the
    /// other nodes take over the sessions of a node that died.
    pub lease_ttl: Duration,
    /// The key relayed submissions are sealed with, the same on every node
    /// (see [`RelayKey`]); `None` derives it from `token` when there is
    /// one. A node with neither does not start: every hand-over between
    /// nodes must be sealed, or anyone reaching a node could act on any
    /// session through it.
    pub relay_key: Option<RelayKey>,
    /// How long a submission relayed to the node running its session
    /// waits for that node's answer (the answer the client gets) before it
    /// is answered `503 owner_unavailable`; [`DEFAULT_RELAY_WAIT`] by
    /// default.
    pub relay_wait: Duration,
    /// The base URL the other nodes hand this one submissions at (see
    /// `host/forward.rs`); `None`: `http://` and the address the cluster's
    /// route listens on, unless that is unspecified (`0.0.0.0`), when this
    /// node is handed nothing directly and its submissions come through the
    /// database.
    pub advertise_url: Option<String>,
    /// A listener of its own for the one route the nodes call each other
    /// on, so that it can be kept on the nodes' private network, off the
    /// API's address (which then answers it `404`), as Temporal and Restate
    /// keep their internal ports apart; `None`: the API's listener serves
    /// it. Either way it acts only on what a node sealed.
    pub cluster_listener: Option<TcpListener>,
    /// The store's several-node part, on the database of
    /// [`ServerConfig::store`] (the same store, seen as shared).
    pub store: Arc<dyn ClusterStore>,
    /// The database's notices (log commits, relayed submissions, released
    /// sessions), listened to from before the server starts.
    pub listener: NoticeListener,
}

impl std::fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterConfig")
            .field("node_id", &self.node_id)
            .field("lease_ttl", &self.lease_ttl)
            .field("relay_wait", &self.relay_wait)
            .field("relay_key", &self.relay_key)
            .field("listener", &self.listener)
            .finish_non_exhaustive()
    }
}

/// The lease time to live of a node by default.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);

/// How long a relayed submission waits for the owner's answer by default.
pub const DEFAULT_RELAY_WAIT: Duration = Duration::from_secs(5);

impl ServerConfig {
    /// A configuration with the defaults: no default model, sessions'
    /// workspaces under the current directory, no token, 256 live sessions
    /// unloaded after 5 minutes idle, 10 s of grace at shutdown; no extra
    /// host names, 10 s to send a request head and 30 s for its body, at
    /// most 1024 connections and 32 KiB request heads.
    pub fn new(store: Arc<dyn CheckpointStore>) -> Self {
        Self {
            store,
            keel: KeelConfig::default(),
            default_model: None,
            workspace_root: PathBuf::from("."),
            launcher: None,
            token: None,
            cors_origin: None,
            max_live_sessions: 256,
            idle_unload: Duration::from_secs(300),
            shutdown_grace: Duration::from_secs(10),
            body_limit: DEFAULT_BODY_LIMIT,
            // A watched session's ring costs about 30 bytes a slot; a turn's
            // events (deltas coalesced) fit in 64 many times over, and a
            // subscriber further behind reads the store.
            live_buffer: 64,
            keep_alive: sse::DEFAULT_KEEP_ALIVE,
            max_steps: DEFAULT_MAX_STEPS,
            submission_capacity: DEFAULT_SUBMISSION_CAPACITY,
            allowed_hosts: Vec::new(),
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            retention_sweep: Duration::from_secs(3600),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            cluster: None,
            access: None,
            budget_clock: BudgetClock::default(),
            webhooks: None,
        }
    }
}

/// Why a server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// Listening beyond loopback without a token.
    #[error("refusing to listen on {0} without a token (one is required off loopback)")]
    TokenRequired(SocketAddr),
    /// The configuration is unusable; the text says why.
    #[error("invalid server configuration: {0}")]
    Config(String),
    /// The listener failed.
    #[error("the server failed: {0}")]
    Io(#[from] std::io::Error),
}

/// What the handlers share.
pub(crate) struct Server {
    host: Arc<Host>,
    metrics: Arc<Metrics>,
    auth: auth::Authenticator,
    /// Where API keys are kept, for `/v1/keys`.
    access: Option<Arc<dyn AccessStore>>,
    cors_origin: Option<HeaderValue>,
    front: front::FrontDoor,
    body_limit: usize,
    keep_alive: Duration,
    /// The AG-UI threads read lately, so a run reads only what is new.
    ag_ui_threads: Arc<frontends::ag_ui_threads::ThreadCache>,
    /// The webhook outbox, for `/v1/webhooks`.
    webhooks: Option<WebhookApi>,
}

impl WebhookApi {
    /// Tells this node's deliverer that the endpoints changed.
    pub(crate) fn changed(&self) {
        self.changes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// What `/v1/webhooks` works with.
pub(crate) struct WebhookApi {
    /// The endpoints and deliveries.
    pub(crate) outbox: Arc<dyn WebhookStore>,
    /// `[webhooks]`: where endpoints may point.
    pub(crate) settings: Arc<keel_config::WebhooksConfig>,
    /// Counts the changes made here, so this node's deliverer reads the
    /// endpoints again at once.
    pub(crate) changes: Arc<std::sync::atomic::AtomicU64>,
}

/// Serves the API on `listener` until `shutdown` resolves, then shuts down
/// gracefully: stops accepting, ends the event streams, lets running turns
/// reach a safe point (interrupting those still running after the grace
/// period) and shuts every live session down.
pub async fn serve(
    listener: TcpListener,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let address = listener.local_addr()?;
    let door = FrontParts::check(address, &config)?;
    if config.max_live_sessions == 0 {
        return Err(ServeError::Config(
            "the live-session bound must be at least 1".to_owned(),
        ));
    }
    let (authenticator, auth_tasks) = auth_parts(door.token.clone(), config.access.clone(), &config.keel.auth).await?;
    let metrics = Arc::new(Metrics::new());
    let store: Arc<dyn CheckpointStore> = Arc::new(MeteredStore::new(config.store, Arc::clone(&metrics)));
    let script_dir = config
        .keel
        .server
        .script_dir
        .as_deref()
        .map(ceiling::ScriptDir::new)
        .transpose()
        .map_err(ServeError::Config)?;
    let tenant_script_dirs =
        tenant_ceiling::tenant_script_dirs(&config.keel, script_dir.as_ref()).map_err(ServeError::Config)?;
    let retention = config
        .keel
        .server
        .retention_days
        .map(|days| Duration::from_secs(u64::from(days) * 24 * 3600));
    let webhook_settings = Arc::new(config.keel.webhooks.clone());
    if let Some(outbox) = &config.webhooks {
        webhooks::store_configured_endpoints(outbox.as_ref(), &webhook_settings)
            .await
            .map_err(ServeError::Config)?;
    }
    let exporter = if telemetry::wanted(&config.keel.telemetry) {
        Some(telemetry::OtlpSpans::start(&config.keel.telemetry, Arc::clone(&metrics)).map_err(ServeError::Config)?)
    } else {
        None
    };
    let spans = exporter
        .clone()
        .map_or_else(keel_agent::telemetry::Spans::default, |exporter| {
            keel_agent::telemetry::Spans::to(exporter).with_content(config.keel.telemetry.capture_content)
        });
    let budgets = Arc::new(budget::Budgets::new(
        config.access.clone(),
        &config.keel,
        config.budget_clock,
        Arc::clone(&metrics),
    ));
    // Every session's workspace is under the root, every tenant's too: a
    // sandboxed command sees only its own there.
    keel_tools::workspace::sandbox::keep_workspaces_apart(&config.workspace_root);
    keel_tools::workspace::sandbox::set_reads(config.keel.server.sandbox_reads);
    let factory = SessionFactory {
        budgets,
        keel: Arc::new(config.keel),
        script_dir,
        tenant_script_dirs,
        default_model: config.default_model,
        workspace_root: config.workspace_root,
        launcher: config.launcher,
        store: Arc::clone(&store),
        metrics: Arc::clone(&metrics),
        max_steps: config.max_steps,
        submission_capacity: config.submission_capacity,
        spans,
    };
    let claimant = config.cluster.as_ref().map_or_else(
        || format!("node-{:016x}", rand::random::<u64>()),
        |cluster| cluster.node_id.clone(),
    );
    let (cluster, notices, cluster_listener) = match config.cluster {
        Some(mut cluster) => {
            let cluster_listener = cluster.cluster_listener.take();
            let reached_at = match &cluster_listener {
                Some(listener) => listener.local_addr()?,
                None => address,
            };
            running::advertise(&cluster, reached_at).await;
            let (node, listener) = cluster_parts(cluster, config.token.as_deref())?;
            (Some(node), Some(listener), cluster_listener)
        }
        None => (None, None, None),
    };
    let limits = HostLimits {
        max_live: config.max_live_sessions,
        idle_unload: config.idle_unload,
        shutdown_grace: config.shutdown_grace,
    };
    let host = Arc::new(Host::new(
        store,
        factory,
        Arc::clone(&metrics),
        limits,
        config.live_buffer,
        cluster,
    ));
    let endpoint_changes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let deliverer = config.webhooks.clone().map(|outbox| {
        let deliverer = Arc::new(webhooks::Deliverer::new(
            outbox,
            Arc::clone(&host.store),
            Arc::clone(&webhook_settings),
            Arc::clone(&metrics),
            claimant,
            Arc::clone(&host.webhook_wake),
            Arc::clone(&endpoint_changes),
        ));
        tokio::spawn(deliverer.run(host.closing_signal()))
    });
    let server = Arc::new(Server {
        host: Arc::clone(&host),
        webhooks: config.webhooks.map(|outbox| WebhookApi {
            outbox,
            settings: webhook_settings,
            changes: endpoint_changes,
        }),
        metrics,
        auth: authenticator,
        access: config.access,
        cors_origin: door.cors_origin,
        front: door.front,
        body_limit: config.body_limit,
        keep_alive: config.keep_alive,
        ag_ui_threads: Arc::new(frontends::ag_ui_threads::ThreadCache::new(AG_UI_THREADS)),
    });
    let keys = server.auth.keys.clone();
    let doors = running::Doors {
        listener,
        app: routes::router(Arc::clone(&server), cluster_listener.is_none()),
        cluster: cluster_listener.map(|listener| (listener, routes::cluster_router(server))),
        limits: door.connection_limits,
    };
    let retention = retention.map(|max_idle| (max_idle, config.retention_sweep));
    running::run(host, doors, retention, notices, shutdown).await;
    for task in auth_tasks {
        task.abort();
    }
    if let Some(deliverer) = deliverer {
        deliverer.abort();
    }
    if let Some(exporter) = exporter {
        // The last turns' spans leave before the process does.
        let flushed = tokio::task::spawn_blocking(move || exporter.flush(Duration::from_secs(5)));
        let _ = flushed.await;
    }
    if let Some(keys) = keys {
        keys.flush_uses().await;
    }
    Ok(())
}

/// The sources of principals, checked and loaded (the API keys once, the
/// JWKS once), with the tasks that keep them fresh.
async fn auth_parts(
    token: Option<auth::Token>,
    access: Option<Arc<dyn AccessStore>>,
    config: &keel_config::AuthConfig,
) -> Result<(auth::Authenticator, Vec<tokio::task::JoinHandle<()>>), ServeError> {
    let mut tasks = Vec::new();
    let jwt = match config.jwt.clone() {
        Some(config) => {
            let verifier = auth::jwt::JwtVerifier::new(config)
                .await
                .map_err(|error| ServeError::Config(error.to_string()))?;
            tasks.push(tokio::spawn(Arc::clone(&verifier).run()));
            Some(verifier)
        }
        None => None,
    };
    let keys = match access {
        Some(access) => {
            let (table, revision) = auth::keys::KeyTable::load(access)
                .await
                .map_err(|error| ServeError::Config(format!("could not load the API keys: {error}")))?;
            tasks.push(tokio::spawn(Arc::clone(&table).run(revision)));
            Some(table)
        }
        None => None,
    };
    let authenticator = auth::Authenticator {
        token,
        keys,
        jwt,
        allow_default_tenant: config.allow_default_tenant,
    };
    Ok((authenticator, tasks))
}

/// What `serve` checks and builds for the listener side from a
/// configuration: the token, the CORS origin, the front door and the
/// bounds on connections.
struct FrontParts {
    token: Option<auth::Token>,
    cors_origin: Option<HeaderValue>,
    front: front::FrontDoor,
    connection_limits: conn::ConnectionLimits,
}

impl FrontParts {
    /// Checks `config`'s listener settings for a server on `address`.
    fn check(address: SocketAddr, config: &ServerConfig) -> Result<Self, ServeError> {
        let token = match config.token.as_deref().map(str::trim) {
            Some("") => return Err(ServeError::Config("the token is empty".to_owned())),
            Some(token) => Some(auth::Token::new(token)),
            None if !address.ip().is_loopback() => return Err(ServeError::TokenRequired(address)),
            None => None,
        };
        let cors_origin = config
            .cors_origin
            .as_deref()
            .map(|origin| {
                HeaderValue::from_str(origin).map_err(|_| ServeError::Config(format!("invalid CORS origin '{origin}'")))
            })
            .transpose()?;
        if config.body_timeout.is_zero() {
            return Err(ServeError::Config("the body timeout must not be zero".to_owned()));
        }
        let front = front::FrontDoor::new(
            address,
            &config.allowed_hosts,
            cors_origin.clone(),
            config.body_limit,
            config.body_timeout,
        )
        .map_err(|error| ServeError::Config(error.to_string()))?;
        if !(1..=MAX_CONNECTIONS_BOUND).contains(&config.max_connections) {
            return Err(ServeError::Config(format!(
                "the connection bound must be between 1 and {MAX_CONNECTIONS_BOUND}"
            )));
        }
        if config.header_timeout.is_zero() {
            return Err(ServeError::Config("the header timeout must not be zero".to_owned()));
        }
        let connection_limits = conn::ConnectionLimits {
            header_timeout: config.header_timeout,
            max_connections: config.max_connections,
            max_header_bytes: config.max_header_bytes,
        };
        Ok(Self {
            token,
            cors_origin,
            front,
            connection_limits,
        })
    }
}

/// A node's part in a cluster, checked: the lease owner its sessions are
/// loaded under, the key relayed submissions are sealed with (from
/// `token` when the node has none of its own) and the database's notices.
fn cluster_parts(cluster: ClusterConfig, token: Option<&str>) -> Result<(host::Node, NoticeListener), ServeError> {
    if cluster.node_id.is_empty()
        || cluster.node_id.chars().any(char::is_control)
        || cluster.lease_ttl < Duration::from_millis(300)
    {
        return Err(ServeError::Config(
            "a node needs an id without control characters and a lease of at least 300 ms".to_owned(),
        ));
    }
    // Each session loaded gets a clock of its own (see `Host::spawn`).
    let owner = LeaseOwner {
        node: cluster.node_id,
        ttl: cluster.lease_ttl,
        clock: LeaseClock::default(),
        leases: cluster.store.clone(),
    };
    // Without a key of its own, a cluster whose API asks for a
    // token seals with a key derived from it: every node checks it.
    let relay_key = cluster.relay_key.or_else(|| {
        let token = token.map(str::trim);
        token.map(|token| RelayKey::derive(token.as_bytes()))
    });
    // Nothing unsealed is ever acted on, so a node without a key could
    // take no hand-over; and one that took them unsealed would let anyone
    // reaching its port (or writing the database) act on any session.
    let Some(relay_key) = relay_key else {
        return Err(ServeError::Config(
            "nodes on a shared database seal what they hand each other: give every node the same key \
             (--cluster-key-file FILE, made with `openssl rand -hex 32 > FILE`) or the same --token-file"
                .to_owned(),
        ));
    };
    let node = host::Node {
        owner,
        store: cluster.store,
        relay_key,
        relay_wait: cluster.relay_wait,
    };
    Ok((node, cluster.listener))
}
