//! A chat on a database that a running `keel serve` serves goes through
//! that server: opening the session here would take it from the server (or,
//! for a new session or a fork, run it beside the server, where it cannot
//! be resumed or edited), so the chat talks to the server's HTTP API, at the
//! address the server recorded in its hold on the database.

use anyhow::bail;
use keel::store::StoreError;

use super::ChatArgs;

/// `args` with `--server` set to the server that serves the database, if
/// one does and it says where it listens; `args` unchanged otherwise.
pub(super) async fn through_server(mut args: ChatArgs) -> anyhow::Result<ChatArgs> {
    if args.server.is_some() {
        return Ok(args);
    }
    let holder = match args.db.share().await {
        Err(StoreError::Held { holder, .. }) => holder,
        // Free (the hold is let go at once), or not to be read here: the
        // local opening takes the hold again and reports what is wrong.
        Ok(_) | Err(_) => return no_server(args),
    };
    let Some(url) = address_of(&holder) else {
        return no_server(args);
    };
    let location = args.db.location()?;
    if args.tools.workspace.is_some() || args.model.config.is_some() {
        bail!(
            "the database {location} is served by {holder}, so the chat goes through it, where the server's \
             workspace and keel.toml apply: omit --workspace and --config, or stop the server"
        );
    }
    eprintln!("the database {location} is served by {holder}: chatting through it");
    args.server = Some(url);
    Ok(args)
}

/// `args` for a chat on the local database, where a token or a key has no use.
fn no_server(args: ChatArgs) -> anyhow::Result<ChatArgs> {
    if args.token_file.is_some() {
        bail!("--token-file is for a server's API: pass --server URL too");
    }
    if args.api_key.is_some() {
        bail!("--api-key is for a server's API: pass --server URL too");
    }
    Ok(args)
}

/// The URL in a server's description of itself (`keel serve (pid 7,
/// http://127.0.0.1:7777)`).
fn address_of(holder: &str) -> Option<String> {
    let start = holder.find("http://").or_else(|| holder.find("https://"))?;
    let url: String = holder[start..]
        .chars()
        .take_while(|c| !c.is_whitespace() && !matches!(c, ')' | ','))
        .collect();
    Some(url)
}

#[cfg(test)]
mod tests {
    use super::address_of;

    #[test]
    fn the_address_is_read_from_the_servers_description() {
        assert_eq!(
            address_of("keel serve (pid 7, http://127.0.0.1:7777)").as_deref(),
            Some("http://127.0.0.1:7777")
        );
        assert_eq!(address_of("keel serve (pid 7)"), None);
    }
}
