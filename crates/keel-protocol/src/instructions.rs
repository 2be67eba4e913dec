//! What a session's model is told besides the conversation: the project
//! instructions read from `AGENTS.md` files, and how queued messages become
//! turns.

use serde::{Deserialize, Serialize};

/// The project instructions a session read from `AGENTS.md` files at its
/// first turn, as recorded (the `instructions_loaded` event and the
/// session's checkpoint): a resumed session uses exactly this text, however
/// the files changed since.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProjectInstructions {
    /// The files read, outermost first (the nearest, most specific, last).
    /// Empty when there was none: the session then has no project
    /// instructions, and a file written later is not picked up.
    #[serde(default)]
    pub sources: Vec<InstructionSource>,
    /// The section appended to the system prompt (empty without sources).
    #[serde(default)]
    pub text: String,
    /// Files that were found but not used, and why (not text, too large,
    /// refused as one of Keel's own files).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

/// One `AGENTS.md` file that went into [`ProjectInstructions`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InstructionSource {
    /// The file, relative to the workspace root (`AGENTS.md` for the
    /// root's own, `<dir>/AGENTS.md` below it).
    pub path: String,
    /// Its size when it was read, in bytes.
    pub bytes: u64,
    /// The SHA-256 of its content when it was read, in lower-case hex.
    pub sha256: String,
    /// Whether only its beginning was used, to stay within the size cap.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// How the user messages waiting in a session's queue become turns when
/// the session gets to them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum QueueMode {
    /// Every message queued by the time a turn starts joins that turn: one
    /// answer to all of them (what a user adding to a request expects).
    #[default]
    Merge,
    /// Each queued message gets a turn, and so an answer, of its own, in
    /// order (what a chat user expects).
    Each,
}

impl QueueMode {
    /// The mode's name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Merge => "merge",
            Self::Each => "each",
        }
    }
}
