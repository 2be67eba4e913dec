//! `keel serve`: the HTTP API over the database's sessions.

use std::path::PathBuf;
use std::process::ExitCode;

use std::time::Duration;

use anyhow::Context;
use clap::Args;
use keel::server::{ClusterConfig, ServerConfig, serve};

use crate::db::DbArgs;

/// Arguments of `keel serve`.
#[derive(Args, Debug)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The address to listen on; anything but loopback needs --token-file.
    #[arg(long, default_value = "127.0.0.1:7777", value_name = "ADDR")]
    listen: String,
    /// A file holding the bearer token every API request must carry.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// The config file [default: $KEEL_CONFIG, ./keel.toml, or
    /// <config dir>/keel/keel.toml].
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// The model of sessions created without one [default: the config's
    /// `model`].
    #[arg(long, env = "KEEL_MODEL", value_name = "SPEC")]
    model: Option<String>,
    /// Each session works in its own directory under this one [default:
    /// the current directory].
    #[arg(long, value_name = "DIR")]
    workspace_root: Option<PathBuf>,
    /// The most sessions loaded at once.
    #[arg(long, default_value_t = 256, value_name = "N")]
    max_live_sessions: usize,
    /// Seconds an idle session stays loaded.
    #[arg(long, default_value_t = 300, value_name = "N")]
    idle_unload_secs: u64,
    /// Seconds running turns get to finish at shutdown before they are
    /// interrupted.
    #[arg(long, default_value_t = 10, value_name = "N")]
    shutdown_grace_secs: u64,
    /// The most model calls one turn may make.
    #[arg(long, default_value_t = keel::agent::DEFAULT_MAX_STEPS, value_name = "N")]
    max_steps: u32,
    /// The one origin allowed to call the API from a browser (CORS is off
    /// without it).
    #[arg(long, value_name = "ORIGIN")]
    cors_origin: Option<String>,
    /// The loosest shell sandbox an API client may ask for [default: the
    /// config's `[server] max_sandbox`, else workspace-write].
    #[arg(long, value_name = "POLICY", value_parser = ["read-only", "workspace-write", "full-access"])]
    max_sandbox: Option<String>,
    /// Tools an API client may set to `auto` approval, comma-separated;
    /// `*` for all [default: the config's `[server] auto_approve`, else
    /// clock,read_file,list_dir,search].
    #[arg(long, value_name = "TOOLS", value_delimiter = ',')]
    auto_approve: Option<Vec<String>>,
    /// Let API clients turn the shell's network on (`tools.network`).
    #[arg(long)]
    allow_network: bool,
    /// The directory `script:` models named by API clients must be in
    /// [default: the config's `[server] script_dir`, else none].
    #[arg(long, value_name = "DIR")]
    script_dir: Option<PathBuf>,
    /// A host name the server also answers for (repeatable); besides it,
    /// only the listen address, localhost, 127.0.0.1 and [::1] are, so a
    /// rebound DNS name gets 421.
    #[arg(long = "allow-host", value_name = "NAME")]
    allow_hosts: Vec<String>,
    /// Seconds a connection gets to send a request head; also how long an
    /// idle kept-alive connection stays open.
    #[arg(long, default_value_t = keel::server::DEFAULT_HEADER_TIMEOUT.as_secs(), value_name = "N")]
    header_timeout_secs: u64,
    /// Seconds a request body gets to arrive whole once its head has; a
    /// body still incomplete then is answered 408 and its connection closed.
    #[arg(long, default_value_t = keel::server::DEFAULT_BODY_TIMEOUT.as_secs(), value_name = "N")]
    body_timeout_secs: u64,
    /// The most connections open at once; further ones wait.
    #[arg(long, default_value_t = keel::server::DEFAULT_MAX_CONNECTIONS, value_name = "N")]
    max_connections: usize,
    /// On PostgreSQL, this node's id among the servers sharing the database
    /// [default: host name, process id and a random suffix].
    #[arg(long, value_name = "ID")]
    node_id: Option<String>,
    /// On PostgreSQL, milliseconds a session's lease lasts unrenewed: how
    /// soon other nodes take over the sessions of a node that died.
    #[arg(long, default_value_t = keel::server::DEFAULT_LEASE_TTL.as_millis() as u64, value_name = "MS")]
    lease_ttl_ms: u64,
    /// On PostgreSQL, milliseconds a submission sent to a node that does
    /// not run its session waits for the owner's answer, which is the
    /// answer the client gets; past it, 503 owner_unavailable [default:
    /// the config's `[server] relay_wait_ms`, else 5000].
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    relay_wait_ms: Option<u64>,
    /// On PostgreSQL, a file holding the secret every node seals relayed
    /// submissions with, so that a row written into the database by
    /// anyone else is refused [default: derived from --token-file; without
    /// either, this host's key in Keel's data directory, made once].
    #[arg(long, env = "KEEL_CLUSTER_KEY_FILE", value_name = "FILE")]
    cluster_key_file: Option<PathBuf>,
    /// On PostgreSQL, the base URL the other nodes reach this one at, to
    /// hand it the submissions for its sessions directly (its host is
    /// also answered for, as with --allow-host) [default: http:// and the
    /// listen address, unless that is 0.0.0.0 or [::]: then submissions
    /// reach this node through the database].
    #[arg(long, value_name = "URL")]
    advertise_url: Option<String>,
    /// On PostgreSQL, a separate address (HOST:PORT) for the one route the
    /// nodes call each other on, to keep it on their private network: the
    /// --listen address then answers it 404, and this is where the other
    /// nodes are told to reach this one (unless --advertise-url says
    /// otherwise) [default: the --listen address serves it].
    #[arg(long, value_name = "ADDR")]
    cluster_listen: Option<String>,
    /// Test use only: moves the clock budgets' rolling days are counted by
    /// this many seconds ahead, so that a test sees the next day's window.
    #[arg(long, hide = true, default_value_t = 0, value_name = "N")]
    test_clock_offset_secs: u64,
}

pub(crate) async fn serve_command(args: ServeArgs) -> anyhow::Result<ExitCode> {
    // Everything that can be wrong with the configuration is reported
    // before the database is opened or the port taken.
    let (mut keel_config, config_path) = keel::config::KeelConfig::discover(args.config.as_deref())?;
    if let Some(path) = &config_path {
        keel::tools::protected::protect(path);
    }
    // The flags override `[server]`, the ceiling on what API clients ask for.
    let ceiling = &mut keel_config.server;
    if let Some(policy) = &args.max_sandbox {
        ceiling.max_sandbox = serde_json::from_value(serde_json::Value::String(policy.clone()))
            .with_context(|| format!("invalid --max-sandbox '{policy}'"))?;
    }
    if let Some(tools) = &args.auto_approve {
        ceiling.auto_approve = tools
            .iter()
            .map(|tool| tool.trim().to_owned())
            .filter(|tool| !tool.is_empty())
            .collect();
    }
    if args.allow_network {
        ceiling.allow_network = true;
    }
    if let Some(dir) = &args.script_dir {
        ceiling.script_dir = Some(dir.clone());
    }
    let default_model = args.model.clone().or_else(|| keel_config.model.clone());
    if let Some(spec) = &default_model {
        keel_config.model(spec)?;
    }
    let relay_key = match &args.cluster_key_file {
        Some(path) => Some(crate::cluster_key::read(path)?),
        None => None,
    };
    let token = match &args.token_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the token file {}", path.display()))?;
            let token = text.trim().to_owned();
            anyhow::ensure!(!token.is_empty(), "the token file {} is empty", path.display());
            keel::tools::protected::protect(path);
            // Redacted from everything stored or returned, like a provider key.
            keel::secrets::register(&token);
            Some(token)
        }
        None => None,
    };
    let workspace_root = match &args.workspace_root {
        Some(dir) => dir.clone(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    std::fs::create_dir_all(&workspace_root)
        .with_context(|| format!("cannot create the workspace root {}", workspace_root.display()))?;
    let workspace_root = workspace_root
        .canonicalize()
        .with_context(|| format!("cannot use {} as the workspace root", workspace_root.display()))?;
    // The record of the workspaces Keel creates, protected before any
    // session runs a command.
    keel::tools::workspace::WorkspaceRoot::open(&workspace_root)
        .with_context(|| format!("cannot use {} as the workspace root", workspace_root.display()))?;
    // One server per SQLite file, or any number of nodes on a PostgreSQL
    // database, never beside local commands (which would take sessions
    // from under a server). Taken before the port, so that the message
    // says who holds the database.
    let pid = std::process::id();
    let node_id = args.node_id.clone().unwrap_or_else(|| default_node_id(pid));
    let location = args.db.location()?;
    // Nodes seal what they hand each other; without a key or a token to
    // derive one from, this host's own key (made once, shared by its nodes).
    let relay_key = match (relay_key, &token, &location) {
        (None, None, keel::store::Location::Postgres(_)) => {
            let path = crate::cluster_key::host_key_path()?;
            let key = crate::cluster_key::host_key(&path)?;
            eprintln!(
                "keel serve seals what it hands other nodes with this host's key {}: \
                 nodes on other hosts need the same file (--cluster-key-file)",
                path.display()
            );
            Some(key)
        }
        (key, _, _) => key,
    };
    args.db.ensure_creatable()?;
    let mut lock = args
        .db
        .lock_for_serving(&format!("keel serve (pid {pid})"), &node_id)
        .await
        .map_err(|error| crate::db::explain_open_error(error, &location))?;
    // Connections, not the open-file limit, should be what runs out first.
    keel::server::raise_open_file_limit();
    let listener = bind(&args.listen, "--listen").await?;
    let address = listener.local_addr()?;
    lock.describe(&format!("keel serve (pid {pid}, http://{address})"))
        .await?;
    if token.is_none() && !address.ip().is_loopback() {
        anyhow::bail!(
            "refusing to listen on {address} without a token: pass --token-file FILE (or listen on 127.0.0.1)"
        );
    }
    let crate::db::Serving {
        store,
        cluster,
        access,
        webhooks,
    } = args.db.open_for_serving().await?;
    let relay_wait = args
        .relay_wait_ms
        .or(keel_config.server.relay_wait_ms.map(std::num::NonZeroU64::get))
        .map_or(keel::server::DEFAULT_RELAY_WAIT, Duration::from_millis);

    let mut config = ServerConfig::new(store);
    config.access = Some(access);
    config.webhooks = Some(webhooks);
    let cluster_listener = match (&args.cluster_listen, &cluster) {
        (Some(listen), Some(_)) => Some(bind(listen, "--cluster-listen").await?),
        (Some(_), None) => anyhow::bail!(
            "--cluster-listen is for nodes on a shared PostgreSQL database (--db postgres://…): \
             a SQLite server has no other nodes"
        ),
        (None, _) => None,
    };
    if let Some((cluster_store, listener)) = cluster {
        eprintln!("keel serve is node {node_id} (leases of {} ms)", args.lease_ttl_ms);
        if let Some(cluster_listener) = &cluster_listener {
            eprintln!(
                "keel serve takes the other nodes' hand-overs on http://{}",
                cluster_listener.local_addr()?
            );
        }
        config.cluster = Some(ClusterConfig {
            node_id,
            lease_ttl: Duration::from_millis(args.lease_ttl_ms),
            relay_wait,
            relay_key,
            advertise_url: args.advertise_url.clone(),
            cluster_listener,
            store: cluster_store,
            listener,
        });
    }
    config.keel = keel_config;
    config.default_model = default_model;
    config.workspace_root = workspace_root;
    // Shell commands are started through this binary's hidden
    // `sandbox-exec` command, which applies the sandbox and runs them:
    // executed as the running binary itself, never by a path a command
    // could replace.
    config.launcher = Some(keel::tools::workspace::sandbox::launcher::SELF_EXE.into());
    config.token = token;
    config.cors_origin = args.cors_origin.clone();
    config.max_live_sessions = args.max_live_sessions;
    config.idle_unload = Duration::from_secs(args.idle_unload_secs);
    config.shutdown_grace = Duration::from_secs(args.shutdown_grace_secs);
    config.max_steps = args.max_steps;
    config.allowed_hosts = args.allow_hosts.clone();
    if let Some(host) = advertised_host(args.advertise_url.as_deref())? {
        config.allowed_hosts.push(host);
    }
    config.header_timeout = Duration::from_secs(args.header_timeout_secs);
    config.body_timeout = Duration::from_secs(args.body_timeout_secs);
    config.max_connections = args.max_connections;
    config.budget_clock = keel::server::BudgetClock::ahead_by(Duration::from_secs(args.test_clock_offset_secs));

    let banner = crate::banner::Banner {
        database: &location,
        config: config_path.as_deref(),
        default_model: config.default_model.as_deref(),
        workspace_root: &config.workspace_root,
        address,
        token_file: args.token_file.as_ref(),
        max_sandbox: config.keel.server.max_sandbox,
    };
    for line in banner.lines() {
        eprintln!("{line}");
    }
    let shutdown = shutdown_signal();
    eprintln!("keel serve listening on http://{address}");
    serve(listener, config, shutdown).await?;
    drop(lock);
    eprintln!("keel serve stopped");
    Ok(ExitCode::SUCCESS)
}

/// The listening socket on `listen`; a clear error when the address is in
/// use or cannot be had, naming the `flag` it came from.
async fn bind(listen: &str, flag: &str) -> anyhow::Result<tokio::net::TcpListener> {
    match tokio::net::TcpListener::bind(listen).await {
        Ok(listener) => Ok(listener),
        Err(error) if error.kind() == std::io::ErrorKind::AddrInUse => anyhow::bail!(
            "cannot listen on {listen}: the address is in use (another keel serve, or another program, \
             listens there): stop it, or pass another {flag} ADDR (for example {flag} 127.0.0.1:7778)"
        ),
        Err(error) => Err(anyhow::anyhow!(error)).with_context(|| {
            format!("cannot listen on {listen}: check {flag} (HOST:PORT, for example 127.0.0.1:7777)")
        }),
    }
}

/// The host name of `--advertise-url`, which the other nodes send as
/// `Host`; an error for a URL that is not `http(s)://HOST[:PORT]`.
fn advertised_host(url: Option<&str>) -> anyhow::Result<Option<String>> {
    let Some(url) = url else { return Ok(None) };
    let parsed = reqwest::Url::parse(url).with_context(|| format!("--advertise-url {url} is not a URL"))?;
    let host = parsed
        .host_str()
        .filter(|_| matches!(parsed.scheme(), "http" | "https"));
    let Some(host) = host else {
        anyhow::bail!(
            "--advertise-url {url}: give http://HOST:PORT or https://HOST:PORT, as the other nodes reach this one"
        );
    };
    Ok(Some(host.trim_start_matches('[').trim_end_matches(']').to_owned()))
}

/// A node id unique among live nodes: the host's name, the process id and
/// a random suffix (a restarted process may reuse a pid).
fn default_node_id(pid: u32) -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "node".to_owned());
    // A UUID v7 starts with the time; its random bits are at the end.
    let id = keel::protocol::new_id();
    let suffix = id.get(id.len().saturating_sub(6)..).unwrap_or_default();
    format!("{host}-{pid}-{suffix}")
}

/// Resolves on SIGTERM or SIGINT. The handlers are installed when this is
/// called, not when the future is first polled: the server does work
/// before it polls it, and a SIGTERM in that window must stop it
/// gracefully rather than kill it.
fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{Signal, SignalKind, signal};
    let watch = |kind: SignalKind, name: &str| match signal(kind) {
        Ok(stream) => Some(stream),
        Err(error) => {
            tracing::warn!(%error, "cannot watch for {name}");
            None
        }
    };
    async fn next(stream: Option<Signal>) {
        match stream {
            Some(mut stream) => {
                stream.recv().await;
            }
            None => std::future::pending().await,
        }
    }
    let terminate = watch(SignalKind::terminate(), "SIGTERM");
    let interrupt = watch(SignalKind::interrupt(), "SIGINT");
    async move {
        tokio::select! {
            () = next(terminate) => {}
            () = next(interrupt) => {}
        }
        eprintln!("keel serve shutting down");
    }
}
