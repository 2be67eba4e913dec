//! `keel events`, `keel sessions` and `keel backup`: reading what is stored.

use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use keel::protocol::{Actor, ActorKind, EventMsg, RecordedEvent};
use keel::store::{CheckpointStoreExt, EventPageRequest, StoreError};

use crate::db::DbArgs;
use crate::print_line;
use crate::terminal::terminal_safe;

/// Arguments of `keel events`.
#[derive(Args, Debug)]
pub(crate) struct EventsArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The session whose log to print.
    #[arg(long, value_name = "ID")]
    session: String,
    /// Print events older than this sequence (for paging backwards).
    #[arg(long, value_name = "SEQ")]
    before: Option<u64>,
    /// How many events at most.
    #[arg(long, default_value_t = 100, value_name = "N")]
    limit: usize,
    /// Print each event as one JSON line.
    #[arg(long)]
    json: bool,
}

/// Arguments of `keel sessions`.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct SessionsArgs {
    #[command(subcommand)]
    command: Option<SessionsCommand>,
    #[command(flatten)]
    db: DbArgs,
    /// How many sessions at most.
    #[arg(long, default_value_t = 50, value_name = "N")]
    limit: usize,
    /// Print each session as one JSON line.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn events(args: EventsArgs) -> anyhow::Result<ExitCode> {
    let store = args.db.open(false).await?;
    let page = store
        .event_page(
            &args.session,
            EventPageRequest {
                before_sequence: args.before,
                limit: args.limit,
            },
        )
        .await?;
    for event in &page.events {
        let line = if args.json {
            serde_json::to_string(event)?
        } else {
            // JSON's escapes leave DEL, C1 and bidi controls raw, and
            // messages are not quoted at all.
            terminal_safe(&describe(event)).into_owned()
        };
        print_line(&line)?;
    }
    if page.has_more
        && !args.json
        && let Some(first) = page.events.first()
    {
        eprintln!("(older events: --before {})", first.sequence);
    }
    Ok(ExitCode::SUCCESS)
}

/// What `keel sessions` does besides listing.
#[derive(Subcommand, Debug)]
pub(crate) enum SessionsCommand {
    /// Delete a session: its events, history, queued submissions and
    /// idempotency keys, in one transaction. With a server running, prefer
    /// `DELETE /v1/sessions/{id}`, which shuts the live session down first.
    Rm(RmArgs),
}

/// Arguments of `keel sessions rm`.
#[derive(Args, Debug)]
pub(crate) struct RmArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The session to delete.
    #[arg(value_name = "ID")]
    session: String,
    /// Also remove the session's workspace directory (under
    /// `--workspace-root`).
    #[arg(long)]
    workspace: bool,
    /// Where `keel serve` put the session's workspace [default: the current
    /// directory, as for `keel serve`].
    #[arg(long, value_name = "DIR", requires = "workspace")]
    workspace_root: Option<PathBuf>,
}

async fn remove(args: RmArgs) -> anyhow::Result<ExitCode> {
    // A served database's sessions may be live: its server deletes them,
    // shutting a live one down first.
    let _hold = match args.db.share().await {
        Ok(hold) => hold,
        Err(StoreError::Held { holder, .. }) => anyhow::bail!(
            "the database {} is served by {holder}: delete through it (DELETE /v1/sessions/{})",
            args.db.location()?,
            args.session
        ),
        Err(error) => return Err(error.into()),
    };
    // A workspace Keel did not create, or one holding Keel's own files, is
    // refused before anything is deleted (see `WorkspaceRoot`).
    let root = if args.workspace {
        Some(match args.workspace_root {
            Some(root) => root,
            None => std::env::current_dir().context("cannot read the current directory")?,
        })
    } else {
        None
    };
    let store = args.db.open(false).await?;
    // The workspace is in its tenant's root, as the server put it.
    let workspace = match &root {
        Some(root) => store.session_summary(&args.session).await?.map(|summary| {
            let dir = keel::server::tenant_workspace_dir(root, &summary.context.tenant, &args.session);
            let name = dir.file_name().map(ToOwned::to_owned).unwrap_or_default();
            (dir.parent().map_or_else(|| root.clone(), ToOwned::to_owned), name)
        }),
        None => None,
    };
    if let Some((root, name)) = &workspace {
        let refused = keel::tools::workspace::WorkspaceRoot::open(root).and_then(|root| root.check_removable(name));
        if let Err(error) = refused {
            store.close().await;
            anyhow::bail!("session '{}' was not deleted: {error}", args.session);
        }
    }
    let existed = store.delete_session(&args.session).await?;
    store.close().await;
    if !existed {
        eprintln!("no session '{}'", terminal_safe(&args.session));
        return Ok(ExitCode::FAILURE);
    }
    if let Some((root, name)) = &workspace {
        keel::tools::workspace::WorkspaceRoot::open(root)
            .and_then(|root| root.remove(name))
            .with_context(|| format!("session '{}' was deleted but its workspace was not", args.session))?;
    }
    print_line(&terminal_safe(&format!("deleted {}", args.session)))?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn sessions(args: SessionsArgs) -> anyhow::Result<ExitCode> {
    if let Some(SessionsCommand::Rm(rm)) = args.command {
        return remove(rm).await;
    }
    let store = args.db.open(false).await?;
    for session in store.list_sessions(args.limit).await? {
        let line = if args.json {
            serde_json::to_string(&session)?
        } else {
            let running = session
                .running_turn_id
                .map(|turn| format!("  (turn {turn} in flight)"))
                .unwrap_or_default();
            let title = session
                .title
                .as_deref()
                .map(|title| format!("  {}", quote(title)))
                .unwrap_or_default();
            let line = format!(
                "{}  bot={}  events={}  updated={}{running}{title}",
                session.session_id,
                session.bot_id,
                session.last_sequence,
                timestamp(session.updated_at_ms)
            );
            terminal_safe(&line).into_owned()
        };
        print_line(&line)?;
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn timestamp(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// One human-readable line per event.
fn describe(event: &RecordedEvent) -> String {
    let detail = match &event.msg {
        EventMsg::SessionStarted(e) => format!("session={} bot={} resumed={}", e.session_id, e.bot_id, e.resumed),
        EventMsg::UserMessage(e) => quote(&e.text),
        EventMsg::ModelStepStarted(e) => format!("step={}", e.step),
        EventMsg::AssistantContentDelta(e) => quote(&e.delta),
        EventMsg::AssistantMessage(e) => quote(&e.text),
        EventMsg::TurnAborted(e) => e.message.clone(),
        EventMsg::Warning(e) => e.message.clone(),
        EventMsg::Error(e) => e.message.clone(),
        EventMsg::SubmissionRejected(e) => e.reason.clone(),
        EventMsg::SubmissionQueued(e) => e.submitted_by.as_ref().map(by).unwrap_or_default(),
        EventMsg::ApprovalDecided(e) => {
            let decision = serde_json::to_value(e.decision)
                .ok()
                .and_then(|value| value.as_str().map(str::to_owned))
                .unwrap_or_default();
            let decided = format!("call={} decision={decision}", e.call_id);
            match &e.decided_by {
                Some(actor) => format!("{decided} {}", by(actor)),
                None => decided,
            }
        }
        _ => String::new(),
    };
    let turn = event
        .msg
        .turn_id()
        .map(|turn| format!(" turn={turn}"))
        .unwrap_or_default();
    format!(
        "{:>6}  {}  {:<24}{turn} {detail}",
        event.sequence,
        timestamp(event.recorded_at_ms),
        event.msg.kind()
    )
    .trim_end()
    .to_owned()
}

/// Who submitted or decided, for the audit trail: `by=TENANT/KIND:ID`,
/// then the key's name or the token's subject when there is one.
fn by(actor: &Actor) -> String {
    let kind = match actor.kind {
        ActorKind::Operator => "operator",
        ActorKind::ApiKey => "key",
        ActorKind::Jwt => "jwt",
    };
    let mut shown = format!("by={}/{kind}:{}", actor.tenant, actor.principal_id);
    if let Some(name) = &actor.name {
        shown.push_str(&format!(" name={}", quote(name)));
    }
    shown
}

/// Text as a JSON string literal, shortened for one line.
fn quote(text: &str) -> String {
    const MAX_CHARS: usize = 120;
    let mut shown: String = text.chars().take(MAX_CHARS).collect();
    if shown.len() < text.len() {
        shown.push('…');
    }
    serde_json::Value::String(shown).to_string()
}

/// Arguments of `keel backup`.
#[derive(Args, Debug)]
pub(crate) struct BackupArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The new file to write the copy to; it must not exist.
    #[arg(value_name = "FILE")]
    file: PathBuf,
}

/// `keel backup FILE`: a consistent snapshot of the database, taken with
/// `VACUUM INTO` while a server may be writing.
pub(crate) async fn backup(args: BackupArgs) -> anyhow::Result<ExitCode> {
    let source = args.db.sqlite_file("keel backup (use pg_dump for PostgreSQL)")?;
    if !source.exists() {
        anyhow::bail!("no database at {}", source.display());
    }
    let started = std::time::Instant::now();
    keel::store::sqlite::backup(source.clone(), args.file.clone())
        .await
        .with_context(|| format!("cannot back {} up", source.display()))?;
    let bytes = std::fs::metadata(&args.file).map(|meta| meta.len()).unwrap_or(0);
    print_line(&format!(
        "backed up {} to {} ({bytes} bytes in {:.2?})",
        source.display(),
        args.file.display(),
        started.elapsed()
    ))?;
    Ok(ExitCode::SUCCESS)
}
