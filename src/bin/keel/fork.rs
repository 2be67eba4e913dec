//! `keel fork`: a new session starting from another's history at a sequence.

use std::process::ExitCode;

use anyhow::bail;
use clap::Args;
use keel::store::StoreError;

use crate::db::DbArgs;
use crate::print_line;

/// Arguments of `keel fork`.
#[derive(Args, Debug)]
pub(crate) struct ForkArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The session to fork.
    #[arg(value_name = "SESSION")]
    session: String,
    /// The sequence of the parent's event the fork starts after (between
    /// turns; `keel events` shows them).
    #[arg(long, value_name = "SEQ", required_unless_present = "before_turn")]
    at: Option<u64>,
    /// Or the parent's turn the fork starts just before (to send that
    /// turn's message again, edited).
    #[arg(long, value_name = "TURN_ID", conflicts_with = "at")]
    before_turn: Option<String>,
    /// The new session's id (a fresh UUID by default).
    #[arg(long, value_name = "ID")]
    id: Option<String>,
}

/// Forks the session and prints the new session's id.
pub(crate) async fn fork(args: ForkArgs) -> anyhow::Result<ExitCode> {
    // The hold keeps a `keel serve` from starting (and creating the same id)
    // while the fork is written; a served database is forked by its server.
    let _hold = match args.db.share().await {
        Ok(hold) => hold,
        Err(StoreError::Held { holder, .. }) => bail!(
            "the database {} is served by {holder}: fork through it (POST /v1/sessions/{}/fork)",
            args.db.location()?,
            args.session
        ),
        Err(error) => return Err(error.into()),
    };
    let store = args.db.open(false).await?;
    let id = args.id.unwrap_or_else(keel::protocol::new_id);
    let forked = async {
        let at = match (args.at, &args.before_turn) {
            (Some(at), _) => at,
            (None, Some(turn_id)) => keel::agent::point_before_turn(store.as_ref(), &args.session, turn_id).await?,
            (None, None) => 0,
        };
        keel::agent::fork_session(store.as_ref(), &args.session, at, &id).await
    }
    .await;
    store.close().await;
    let forked = forked?;
    print_line(&crate::terminal::terminal_safe(&format!(
        "forked {} at {} into {id} ({} history items)",
        forked.parent_session_id, forked.at_sequence, forked.history_items
    )))?;
    Ok(ExitCode::SUCCESS)
}
