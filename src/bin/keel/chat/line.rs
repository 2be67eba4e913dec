//! The lines typed at the chat's prompt: messages, and the `/` commands.

/// What a line typed at the prompt asks for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Line {
    /// Nothing but blanks: ignored.
    Empty,
    /// A message for the model.
    Message(String),
    /// `/exit` or `/quit`.
    Exit,
    /// `/help`.
    Help,
    /// `/session`: print the session id.
    Session,
    /// `/compact`: compact the history now.
    Compact,
    /// `/retry`: roll the last answer back and answer again.
    Retry,
    /// `/edit TEXT`: replace the last message with TEXT, in a fork.
    Edit(String),
    /// `/model SPEC`: the session's model from now on.
    Model(String),
    /// A `/word` that is no command.
    Unknown(String),
}

impl Line {
    /// What `line` asks for; `//` escapes a message that starts with `/`.
    pub(super) fn parse(line: &str) -> Self {
        let trimmed = line.trim();
        if trimmed.is_empty() {
            return Line::Empty;
        }
        if let Some(escaped) = line.trim_start().strip_prefix("//") {
            return Line::Message(format!("/{escaped}"));
        }
        if !trimmed.starts_with('/') {
            return Line::Message(line.to_owned());
        }
        match trimmed.split_whitespace().next().unwrap_or(trimmed) {
            "/exit" | "/quit" => Line::Exit,
            "/help" | "/?" => Line::Help,
            "/session" => Line::Session,
            "/compact" => Line::Compact,
            "/retry" => Line::Retry,
            "/edit" => Line::Edit(argument(trimmed, "/edit")),
            "/model" => Line::Model(argument(trimmed, "/model")),
            other => Line::Unknown(other.to_owned()),
        }
    }
}

/// What follows `command` on the line, trimmed.
fn argument(line: &str, command: &str) -> String {
    line.strip_prefix(command).map(str::trim).unwrap_or_default().to_owned()
}

/// What `/help` prints.
pub(super) const HELP: &str = "\
Each line is a message; the answer streams as it arrives.
  /session     print this session's id (resume it with keel chat --session ID)
  /compact     replace the older history, for the model, with its summary
  /retry       roll the last answer back and answer the last message again
  /edit TEXT   send TEXT in place of the last message, in a fork of this
               session (the session as it was stays as it is)
  /model SPEC  answer with the model SPEC from now on (provider:name, or a
               model named in keel.toml)
  /help        this help
  /exit        leave (also Ctrl-D, or Ctrl-C at an empty prompt)
  //text       send a message that starts with '/'
Ctrl-C during an answer interrupts the turn; a second Ctrl-C leaves.
Up and Down recall earlier lines.";

#[cfg(test)]
mod tests {
    use super::Line;

    #[test]
    fn lines_are_messages_unless_they_are_commands() {
        assert_eq!(Line::parse("  "), Line::Empty);
        assert_eq!(Line::parse("hello /exit"), Line::Message("hello /exit".to_owned()));
        assert_eq!(Line::parse(" /exit "), Line::Exit);
        assert_eq!(Line::parse("/quit"), Line::Exit);
        assert_eq!(Line::parse("/session"), Line::Session);
        assert_eq!(Line::parse("/help me"), Line::Help);
        assert_eq!(Line::parse("/nope"), Line::Unknown("/nope".to_owned()));
        assert_eq!(Line::parse("/retry"), Line::Retry);
        assert_eq!(
            Line::parse(" /edit  say it again "),
            Line::Edit("say it again".to_owned())
        );
        assert_eq!(Line::parse("/edit"), Line::Edit(String::new()));
        assert_eq!(
            Line::parse("/model  openai:gpt-4.1 "),
            Line::Model("openai:gpt-4.1".to_owned())
        );
        assert_eq!(Line::parse("//etc/hosts?"), Line::Message("/etc/hosts?".to_owned()));
    }
}
