//! The tools `keel chat` can offer the model as client tools
//! (`--client-tool NAME`), to try a session's client tools from a terminal:
//! the session declares them, the model calls them, and the chat runs them
//! here (or asks the user) and sends the result back as a
//! `client_tool_result` op.

use std::time::SystemTime;

use keel::protocol::{ClientToolRequestedEvent, ClientToolSpec, MAX_CLIENT_TOOL_OUTPUT_BYTES, Op};
use serde_json::{Value, json};

/// A tool of the chat's small catalogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ClientTool {
    /// The time on the machine running the chat.
    #[value(name = "local_time")]
    LocalTime,
    /// Sends back the text it was given.
    #[value(name = "echo")]
    Echo,
    /// Asks the person at the terminal a question; the answer is the result.
    #[value(name = "ask_user")]
    AskUser,
}

impl ClientTool {
    /// The name the model calls the tool by.
    pub(crate) fn name(self) -> &'static str {
        match self {
            ClientTool::LocalTime => "local_time",
            ClientTool::Echo => "echo",
            ClientTool::AskUser => "ask_user",
        }
    }

    /// The tool of the catalogue called `name`, if there is one.
    pub(crate) fn named(name: &str) -> Option<Self> {
        [ClientTool::LocalTime, ClientTool::Echo, ClientTool::AskUser]
            .into_iter()
            .find(|tool| tool.name() == name)
    }

    /// The tool as the session declares it to the model.
    pub(crate) fn spec(self) -> ClientToolSpec {
        let (description, parameters) = match self {
            ClientTool::LocalTime => (
                "The current time on the user's machine (UTC, RFC 3339, and milliseconds since the Unix epoch).",
                json!({"type": "object", "properties": {}, "additionalProperties": false}),
            ),
            ClientTool::Echo => (
                "Sends the given text back unchanged.",
                json!({
                    "type": "object",
                    "properties": {"text": {"type": "string", "description": "The text to send back."}},
                    "required": ["text"],
                    "additionalProperties": false,
                }),
            ),
            ClientTool::AskUser => (
                "Asks the user a question and returns their answer.",
                json!({
                    "type": "object",
                    "properties": {"question": {"type": "string", "description": "The question to ask."}},
                    "required": ["question"],
                    "additionalProperties": false,
                }),
            ),
        };
        ClientToolSpec {
            name: self.name().to_owned(),
            description: description.to_owned(),
            parameters,
        }
    }
}

/// The specs of `tools`, each once, in the order given.
pub(crate) fn specs(tools: &[ClientTool]) -> Vec<ClientToolSpec> {
    let mut seen = Vec::new();
    for tool in tools {
        if !seen.contains(tool) {
            seen.push(*tool);
        }
    }
    seen.into_iter().map(ClientTool::spec).collect()
}

/// What a call of a chat's client tool asks for.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Call {
    /// Answered at once with this result.
    Answer(Answer),
    /// The user is to be asked this question.
    Ask(String),
}

/// A result to send back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    /// The output (or, with `is_error`, the error message).
    pub(crate) output: String,
    /// Whether the call failed.
    pub(crate) is_error: bool,
}

impl Answer {
    /// A successful result.
    pub(crate) fn ok(output: impl Into<String>) -> Self {
        Self {
            output: output.into(),
            is_error: false,
        }
    }

    /// A failed call, with the error message.
    pub(crate) fn error(message: impl Into<String>) -> Self {
        Self {
            output: message.into(),
            is_error: true,
        }
    }

    /// The op answering `request` with this result: an output over the cap
    /// is cut to an error saying so, since the session refuses it whole.
    pub(crate) fn op(self, request: &ClientToolRequestedEvent) -> Op {
        let answer = if self.output.len() > MAX_CLIENT_TOOL_OUTPUT_BYTES {
            Answer::error(format!(
                "the result was {} bytes, over the {MAX_CLIENT_TOOL_OUTPUT_BYTES}-byte limit",
                self.output.len()
            ))
        } else {
            self
        };
        Op::ClientToolResult {
            call_id: request.call_id.clone(),
            output: answer.output,
            is_error: answer.is_error,
        }
    }
}

/// What `request` (a call of one of `tools`) asks for; `None` when the tool
/// is not one of them (another client of the session answers it).
pub(crate) fn call(tools: &[ClientTool], request: &ClientToolRequestedEvent) -> Option<Call> {
    let tool = ClientTool::named(&request.name).filter(|tool| tools.contains(tool))?;
    let arguments = match parse_arguments(&request.arguments) {
        Ok(arguments) => arguments,
        Err(message) => return Some(Call::Answer(Answer::error(message))),
    };
    Some(match tool {
        ClientTool::LocalTime => Call::Answer(local_time(SystemTime::now())),
        ClientTool::Echo => Call::Answer(match string_argument(&arguments, "text") {
            Ok(text) => Answer::ok(text),
            Err(message) => Answer::error(message),
        }),
        ClientTool::AskUser => match string_argument(&arguments, "question") {
            Ok(question) => Call::Ask(question),
            Err(message) => Call::Answer(Answer::error(message)),
        },
    })
}

/// The arguments as a JSON object (empty text is no arguments).
fn parse_arguments(text: &str) -> Result<serde_json::Map<String, Value>, String> {
    if text.trim().is_empty() {
        return Ok(serde_json::Map::new());
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err("invalid arguments: expected a JSON object".to_owned()),
        Err(error) => Err(format!("invalid arguments: {error}")),
    }
}

/// The string argument `name`.
fn string_argument(arguments: &serde_json::Map<String, Value>, name: &str) -> Result<String, String> {
    match arguments.get(name) {
        Some(Value::String(text)) => Ok(text.clone()),
        Some(_) => Err(format!("invalid arguments: '{name}' must be a string")),
        None => Err(format!("invalid arguments: '{name}' is required")),
    }
}

/// `local_time`'s result for the moment `now`.
fn local_time(now: SystemTime) -> Answer {
    let unix_ms = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX));
    let result = json!({
        "utc": humantime::format_rfc3339_seconds(now).to_string(),
        "unix_ms": unix_ms,
    });
    Answer::ok(result.to_string())
}

/// The answer the user gave to `ask_user` (`None`: the input ended first).
pub(crate) fn user_answer(answer: Option<String>) -> Answer {
    match answer {
        Some(text) => Answer::ok(text),
        None => Answer::error("the user gave no answer (the input ended)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(name: &str, arguments: &str) -> ClientToolRequestedEvent {
        ClientToolRequestedEvent {
            turn_id: "t".into(),
            call_id: "c".into(),
            name: name.into(),
            arguments: arguments.into(),
            expires_at_ms: None,
        }
    }

    const ALL: [ClientTool; 3] = [ClientTool::LocalTime, ClientTool::Echo, ClientTool::AskUser];

    #[test]
    fn each_tool_is_declared_with_an_object_schema_once() {
        let declared = specs(&[ClientTool::Echo, ClientTool::AskUser, ClientTool::Echo]);
        let names: Vec<&str> = declared.iter().map(|spec| spec.name.as_str()).collect();
        assert_eq!(names, ["echo", "ask_user"]);
        for tool in ALL {
            let spec = tool.spec();
            assert_eq!(spec.parameters["type"], "object", "{}", spec.name);
            assert!(!spec.description.is_empty());
            assert_eq!(ClientTool::named(&spec.name), Some(tool));
            // The server parses what the chat sends with the protocol's type.
            let wire = serde_json::to_value(&spec).expect("serialize");
            let parsed: ClientToolSpec = serde_json::from_value(wire).expect("parse");
            assert_eq!(parsed, spec);
        }
    }

    #[test]
    fn calls_are_answered_from_their_arguments() {
        assert_eq!(
            call(&ALL, &request("echo", r#"{"text": "hi there"}"#)),
            Some(Call::Answer(Answer::ok("hi there")))
        );
        assert_eq!(
            call(&ALL, &request("ask_user", r#"{"question": "Colour?"}"#)),
            Some(Call::Ask("Colour?".into()))
        );
        let Some(Call::Answer(time)) = call(&ALL, &request("local_time", "")) else {
            panic!("local_time answers at once");
        };
        assert!(!time.is_error);
        let value: Value = serde_json::from_str(&time.output).expect("JSON");
        assert!(value["utc"].as_str().is_some_and(|utc| utc.ends_with('Z')), "{value}");
        assert!(value["unix_ms"].as_u64().is_some_and(|ms| ms > 1_600_000_000_000));
    }

    #[test]
    fn bad_arguments_are_an_error_result_and_other_tools_are_left_alone() {
        let error = |name: &str, arguments: &str| match call(&ALL, &request(name, arguments)) {
            Some(Call::Answer(answer)) if answer.is_error => answer.output,
            other => panic!("expected an error result, got {other:?}"),
        };
        assert!(error("echo", "{not json").starts_with("invalid arguments:"));
        assert_eq!(error("echo", "[1]"), "invalid arguments: expected a JSON object");
        assert_eq!(error("echo", "{}"), "invalid arguments: 'text' is required");
        assert_eq!(
            error("ask_user", r#"{"question": 7}"#),
            "invalid arguments: 'question' must be a string"
        );
        assert_eq!(call(&ALL, &request("browser_click", "{}")), None, "not a chat tool");
        assert_eq!(
            call(&[ClientTool::Echo], &request("ask_user", r#"{"question": "q"}"#)),
            None,
            "not declared by this chat"
        );
    }

    #[test]
    fn an_answer_over_the_cap_becomes_an_error_saying_so() {
        let op = Answer::ok("x".repeat(MAX_CLIENT_TOOL_OUTPUT_BYTES + 1)).op(&request("echo", "{}"));
        let Op::ClientToolResult {
            call_id,
            output,
            is_error,
        } = &op
        else {
            panic!("a client_tool_result op");
        };
        assert_eq!(call_id, "c");
        assert!(*is_error);
        assert!(output.contains("over the"), "{output}");
        assert!(op.validate().is_ok());
        assert!(user_answer(None).is_error);
        assert_eq!(user_answer(Some("blue".into())), Answer::ok("blue"));
    }
}
