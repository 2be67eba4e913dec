//! `keel keys`: the operator's API keys, made, listed and revoked in the
//! database itself (a running server picks a change up within a second).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use keel::protocol::now_ms;
use keel::server::{new_api_key, parse_scopes};
use keel::store::{ApiKeyRecord, StoreError};
use serde_json::json;

use crate::db::DbArgs;
use crate::log::timestamp;
use crate::print_line;
use crate::terminal::terminal_safe;

/// Arguments of `keel keys`.
#[derive(Args, Debug)]
pub(crate) struct KeysArgs {
    #[command(subcommand)]
    command: KeysCommand,
}

#[derive(Subcommand, Debug)]
enum KeysCommand {
    /// Make a key and print it, this once (only its hash is stored).
    Create(CreateArgs),
    /// List the keys (never their secrets), oldest first.
    List(ListArgs),
    /// Revoke a key: it stops working on every server within a second,
    /// its open streams included.
    Revoke(RevokeArgs),
}

#[derive(Args, Debug)]
struct CreateArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The tenant whose sessions the key acts on.
    #[arg(long, value_name = "TENANT")]
    tenant: String,
    /// A name for people ("ci", "alice's laptop").
    #[arg(long, value_name = "NAME")]
    name: String,
    /// What the key may do, comma-separated: read, submit, approve, admin.
    #[arg(long, value_name = "SCOPES", value_delimiter = ',', required = true)]
    scopes: Vec<String>,
    /// How long the key works (30d, 12h, 90m…); for ever without it.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    expires_in: Option<Duration>,
    /// Print the key and its record as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct ListArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Print each key as one JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct RevokeArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The key's id (as `keel keys list` shows it).
    id: String,
}

/// Runs `keel keys …`.
pub(crate) async fn keys(args: KeysArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        KeysCommand::Create(args) => create(args).await,
        KeysCommand::List(args) => list(args).await,
        KeysCommand::Revoke(args) => revoke(args).await,
    }
}

async fn create(args: CreateArgs) -> anyhow::Result<ExitCode> {
    let scopes = parse_scopes(&args.scopes)?;
    let now = now_ms();
    let expires_at_ms = args
        .expires_in
        .map(|duration| now.saturating_add(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)));
    let made = new_api_key(&args.tenant, &args.name, &scopes, expires_at_ms, now)?;
    if args.tenant == keel::protocol::DEFAULT_TENANT {
        eprintln!(
            "note: the tenant `default` holds the operator's own sessions; a server takes this key only \
             where keel.toml says `[auth] allow_default_tenant = true`"
        );
    }
    let access = args.db.open_access(true).await?;
    access
        .create_api_key(&made.record)
        .await
        .context("cannot store the key")?;
    if args.json {
        let mut shown = view(&made.record);
        shown["key"] = json!(made.key);
        print_line(&shown.to_string())?;
    } else {
        // The key alone on stdout, so that `KEY=$(keel keys create …)` works.
        print_line(&made.key)?;
        eprintln!(
            "made key {} for tenant {} (scopes {}); it is shown this once, keep it secret",
            made.record.id,
            made.record.tenant,
            made.record.scopes.join(",")
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn list(args: ListArgs) -> anyhow::Result<ExitCode> {
    let access = args.db.open_access(false).await?;
    let keys = access.api_keys().await?;
    if args.json {
        for key in &keys {
            print_line(&view(key).to_string())?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let now = now_ms();
    print_line("ID                TENANT  NAME  SCOPES  STATE  CREATED  LAST USED  EXPIRES")?;
    for key in &keys {
        let line = format!(
            "{}  {}  {}  {}  {}  {}  {}  {}",
            key.id,
            key.tenant,
            key.name,
            key.scopes.join(","),
            state(key, now),
            timestamp(key.created_at_ms),
            key.last_used_at_ms.map_or_else(|| "never".to_owned(), timestamp),
            key.expires_at_ms.map_or_else(|| "never".to_owned(), timestamp),
        );
        print_line(&terminal_safe(&line))?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn revoke(args: RevokeArgs) -> anyhow::Result<ExitCode> {
    let access = args.db.open_access(false).await?;
    match access.revoke_api_key(&args.id, now_ms()).await {
        Ok(true) => {
            eprintln!("revoked key {}", args.id);
            Ok(ExitCode::SUCCESS)
        }
        Ok(false) => anyhow::bail!("no key '{}' (see keel keys list)", args.id),
        Err(StoreError::Invalid(message)) => anyhow::bail!("{message}"),
        Err(error) => Err(error.into()),
    }
}

/// Whether a key works now.
fn state(key: &ApiKeyRecord, now_ms: u64) -> &'static str {
    if key.revoked_at_ms.is_some() {
        "revoked"
    } else if key.expires_at_ms.is_some_and(|at| at <= now_ms) {
        "expired"
    } else {
        "active"
    }
}

/// A key as JSON, the shape of `GET /v1/keys`' items: no secret, no hash.
fn view(key: &ApiKeyRecord) -> serde_json::Value {
    json!({
        "id": key.id,
        "tenant": key.tenant,
        "name": key.name,
        "scopes": key.scopes,
        "created_at_ms": key.created_at_ms,
        "last_used_at_ms": key.last_used_at_ms,
        "expires_at_ms": key.expires_at_ms,
        "revoked_at_ms": key.revoked_at_ms,
    })
}
