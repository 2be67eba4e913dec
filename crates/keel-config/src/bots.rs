//! `[bots.<id>]`: the defaults of the sessions of one bot.
//!
//! A session belongs to a bot (`bot_id` at creation). Its bot's table says
//! what the session starts with when the request does not say: its system
//! prompt, whether it is a coding agent, its model, how queued messages
//! become turns. They are defaults, not limits: the ceiling (`[server]`)
//! still bounds what a request may ask for, and a session keeps what it was
//! created with when the file changes later.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};

use super::KeelConfig;
use keel_agent::{CODING_AGENT_PROMPT, ClientToolSpec, MAX_BOT_ID_BYTES, QueueMode};

/// One bot's defaults (`[bots.<id>]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BotConfig {
    /// The bot's system prompt, in place of Keel's default coding prompt
    /// (an empty string: none).
    pub instructions: Option<String>,
    /// Whether the bot's sessions are coding agents (default `true`): they
    /// get Keel's coding prompt when they have tools and no instructions,
    /// and read the project's `AGENTS.md`. `false` (a chat bot): no
    /// default prompt, no `AGENTS.md`, the built-in tools off unless the
    /// request turns them on, and one turn per queued message.
    pub coding_agent: Option<bool>,
    /// The model spec of the bot's sessions that name none.
    pub model: Option<String>,
    /// How queued messages become turns (default: `merge` for a coding
    /// agent, `each` otherwise).
    pub queue_mode: Option<QueueMode>,
    /// Tools the client executes, offered to the bot's sessions that
    /// declare none of their own (a session's list replaces this one).
    #[serde(default, deserialize_with = "client_tools")]
    pub client_tools: Vec<ClientToolSpec>,
    /// How long a client has to answer a call of the bot's sessions, in
    /// seconds (0: for ever); `[tools] client_tool_timeout_secs` when unset.
    pub client_tool_timeout_secs: Option<u64>,
}

/// `client_tools`, checked as a session's are (names, schemas, bounds),
/// so a table no session could use is an error with its place in the file.
fn client_tools<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<ClientToolSpec>, D::Error> {
    let mut tools = Vec::<ClientToolSpec>::deserialize(deserializer)?;
    keel_tools::client::complete_client_tools(&mut tools);
    let reserved = keel_tools::client::server_tool_names();
    keel_tools::client::check_client_tools(&tools, |name| reserved.iter().any(|taken| taken == name))
        .map_err(serde::de::Error::custom)?;
    Ok(tools)
}

impl BotConfig {
    /// Whether the bot's sessions are coding agents.
    pub fn is_coding_agent(&self) -> bool {
        self.coding_agent.unwrap_or(true)
    }

    /// How the bot's sessions turn queued messages into turns.
    pub fn queue_mode(&self) -> QueueMode {
        self.queue_mode.unwrap_or(if self.is_coding_agent() {
            QueueMode::Merge
        } else {
            QueueMode::Each
        })
    }

    /// The system prompt of a session of this bot that was given none:
    /// the bot's own, or Keel's coding prompt when the session has tools
    /// (`has_tools`) and the bot is a coding agent. Fixed by the host when
    /// the session is created, so a later change of the default or of this
    /// file does not change a running conversation.
    pub fn default_instructions(&self, has_tools: bool) -> Option<String> {
        match &self.instructions {
            Some(text) => Some(text.clone()),
            None if self.is_coding_agent() && has_tools => Some(CODING_AGENT_PROMPT.to_owned()),
            None => None,
        }
    }
}

impl KeelConfig {
    /// The defaults of `bot_id`'s sessions: its `[bots.<id>]` table, or
    /// the defaults (a coding agent) when the file has none.
    pub fn bot(&self, bot_id: &str) -> BotConfig {
        self.bots.get(bot_id).cloned().unwrap_or_default()
    }
}

/// A bot id as a `[bots]` key: checked like the ids sessions carry, so a
/// table no session can ever use is an error with its place in the file.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct BotId(String);

impl std::borrow::Borrow<str> for BotId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for BotId {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for BotId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let id = String::deserialize(deserializer)?;
        let printable = id.bytes().all(|byte| (b' '..=b'~').contains(&byte));
        if id.is_empty() || id.len() > MAX_BOT_ID_BYTES || !printable {
            return Err(serde::de::Error::custom(format!(
                "bot id {id:?} must be 1 to {MAX_BOT_ID_BYTES} printable ASCII characters"
            )));
        }
        Ok(Self(id))
    }
}

/// The `[bots]` table.
pub type Bots = BTreeMap<BotId, BotConfig>;
