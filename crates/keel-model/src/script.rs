//! The scripted model: answers read from a JSON-lines file, one per model call.
//!
//! Each non-blank line is one response, used in order across the session's
//! model calls (the position is the session's durable call count, so it
//! survives a restart):
//!
//! - `{"text": "…"}`: the whole text, streamed as one delta;
//! - `{"chunks": ["Hel", "lo"], "delay_ms": 100}`: streamed chunk by chunk,
//!   pausing `delay_ms` before each;
//! - `{"error": "…"}`: the model call fails with that message;
//! - `{"tool_calls": [{"name": "clock", "arguments": {}}]}`: the model asks
//!   for tool calls (with optional `"text"` or `"chunks"` streamed first);
//!   `arguments` is a JSON object, or a string sent as it is (so a script
//!   can produce malformed arguments), and an `id` may be given.
//!
//! Any response may also carry `"usage": {"input_tokens": N, "output_tokens": N}`.
//!
//! A line with `"summary": true` answers a summary request (context
//! compaction) instead: those lines are used in order by the session's
//! summaries, and the other lines by its ordinary model calls.
//!
//! Loading is careful because a spec may come from an API client: only a
//! regular file is read (it is opened non-blocking, so a FIFO cannot stall
//! the caller, and `/dev/zero` is refused before reading), at most
//! [`MAX_SCRIPT_BYTES`], and a malformed line is reported by its number and
//! the kind of error only, never with text from the file. Loading blocks:
//! async callers run it on a blocking thread.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::{BoxFuture, Model, ModelEvent, ModelEventSink, ModelOutput, ModelRequest, RequestPurpose, ToolCall};
use keel_protocol::TokenUsage;
use keel_protocol::{Error, Result};

/// The largest script file loaded.
pub const MAX_SCRIPT_BYTES: u64 = 8 * 1024 * 1024;

/// One line of a script, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptLine {
    text: Option<String>,
    chunks: Option<Vec<String>>,
    delay_ms: Option<u64>,
    error: Option<String>,
    tool_calls: Option<Vec<ScriptCall>>,
    usage: Option<TokenUsage>,
    #[serde(default)]
    summary: bool,
}

/// A tool call in a script.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptCall {
    id: Option<String>,
    name: String,
    #[serde(default)]
    arguments: serde_json::Value,
}

/// One scripted response.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Response {
    Answer {
        chunks: Vec<String>,
        delay: Duration,
        tool_calls: Vec<ToolCall>,
        usage: Option<TokenUsage>,
    },
    Error(String),
}

/// A [`Model`] that plays back a script file.
#[derive(Debug, Clone)]
pub struct ScriptedModel {
    path: PathBuf,
    responses: Vec<Response>,
    /// The answers to summary requests, in order.
    summaries: Vec<Response>,
}

impl ScriptedModel {
    /// Reads and checks the whole script, so a bad line is reported before
    /// any session work starts. Blocks on the file system.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text =
            read_script(path).map_err(|why| Error::Config(format!("cannot read script {}: {why}", path.display())))?;
        let (summaries, responses) = parse_all(&text)
            .map_err(|(line, error)| Error::Config(format!("script {} line {line}: {error}", path.display())))?;
        if responses.is_empty() {
            return Err(Error::Config(format!("script {} has no responses", path.display())));
        }
        Ok(Self {
            path: path.to_path_buf(),
            responses,
            summaries,
        })
    }
}

/// The text of a script file: a regular file of at most
/// [`MAX_SCRIPT_BYTES`] bytes of UTF-8.
fn read_script(path: &Path) -> std::result::Result<String, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;

    // Non-blocking, so opening a FIFO does not wait for a writer; the type
    // check below then refuses it. Reads of a regular file ignore the flag.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|error| error.to_string())?;
    let metadata = file.metadata().map_err(|error| error.to_string())?;
    if !metadata.is_file() {
        return Err("not a regular file".to_owned());
    }
    let too_large = || format!("larger than {MAX_SCRIPT_BYTES} bytes");
    if metadata.len() > MAX_SCRIPT_BYTES {
        return Err(too_large());
    }
    // The size may change after the check; the read is bounded anyway.
    let mut bytes = Vec::new();
    file.take(MAX_SCRIPT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| error.to_string())?;
    if bytes.len() as u64 > MAX_SCRIPT_BYTES {
        return Err(too_large());
    }
    String::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_owned())
}

/// What is wrong with a line, without quoting it: serde's messages can
/// quote the file (an unknown field's name), which may not be the caller's
/// to read.
fn describe(error: &serde_json::Error) -> String {
    let what = match error.classify() {
        serde_json::error::Category::Syntax => "not valid JSON",
        serde_json::error::Category::Eof => "the JSON ends early",
        serde_json::error::Category::Data => {
            "not a response: an unknown field or a value of the wrong type (the fields are text, chunks, \
             delay_ms, error, tool_calls, usage, summary)"
        }
        serde_json::error::Category::Io => "unreadable",
    };
    format!("column {}: {what}", error.column())
}

/// The ordinary responses of a script.
#[cfg(test)]
fn parse(text: &str) -> std::result::Result<Vec<Response>, (usize, String)> {
    parse_all(text).map(|(_, responses)| responses)
}

/// The summary answers and the ordinary responses of a script.
type Parsed = (Vec<Response>, Vec<Response>);

fn parse_all(text: &str) -> std::result::Result<Parsed, (usize, String)> {
    let mut responses = Vec::new();
    let mut summaries = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let number = index + 1;
        let parsed: ScriptLine = serde_json::from_str(line).map_err(|error| (number, describe(&error)))?;
        let delay = Duration::from_millis(parsed.delay_ms.unwrap_or(0));
        let tool_calls: Vec<ToolCall> = parsed
            .tool_calls
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(position, call)| ToolCall {
                call_id: call.id.unwrap_or_else(|| format!("call_{number}_{position}")),
                name: call.name,
                arguments: match call.arguments {
                    serde_json::Value::Null => "{}".to_owned(),
                    serde_json::Value::String(raw) => raw,
                    other => other.to_string(),
                },
            })
            .collect();
        let answer = |chunks| Response::Answer {
            chunks,
            delay,
            tool_calls: tool_calls.clone(),
            usage: parsed.usage,
        };
        let response = match (parsed.text, parsed.chunks, parsed.error) {
            (Some(text), None, None) => answer(vec![text]),
            (None, Some(chunks), None) => answer(chunks),
            (None, None, None) if !tool_calls.is_empty() => answer(Vec::new()),
            (None, None, Some(error)) if tool_calls.is_empty() => Response::Error(error),
            _ => {
                return Err((
                    number,
                    "expected one of \"text\", \"chunks\", \"error\" or \"tool_calls\" (text or chunks may \
                     come with tool_calls)"
                        .into(),
                ));
            }
        };
        if parsed.summary {
            summaries.push(response);
        } else {
            responses.push(response);
        }
    }
    Ok((summaries, responses))
}

impl Model for ScriptedModel {
    fn respond<'a>(&'a self, request: ModelRequest<'a>, events: ModelEventSink) -> BoxFuture<'a, Result<ModelOutput>> {
        Box::pin(async move {
            let index = usize::try_from(request.call_index).unwrap_or(usize::MAX);
            let (responses, kind) = match request.purpose {
                RequestPurpose::Summary => (&self.summaries, "summary"),
                _ => (&self.responses, "model call"),
            };
            let Some(response) = responses.get(index) else {
                return Err(Error::Model(format!(
                    "script {} is exhausted: it has {} {kind} responses and this is {kind} {}",
                    self.path.display(),
                    responses.len(),
                    request.call_index + 1
                )));
            };
            match response {
                Response::Error(message) => Err(Error::Model(message.clone())),
                Response::Answer {
                    chunks,
                    delay,
                    tool_calls,
                    usage,
                } => {
                    let mut text = String::new();
                    for chunk in chunks {
                        if !delay.is_zero() {
                            tokio::time::sleep(*delay).await;
                        }
                        events(ModelEvent::TextDelta(chunk.clone()))?;
                        text.push_str(chunk);
                    }
                    let output = ModelOutput::text(text).with_tool_calls(tool_calls.clone());
                    Ok(match usage {
                        Some(usage) => output.with_usage(*usage),
                        None => output,
                    })
                }
            }
        })
    }

    fn name(&self) -> String {
        format!("script:{}", self.path.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_line_kind_and_skips_blank_lines() {
        let script = "{\"text\": \"hi\"}\n\n{\"chunks\": [\"a\", \"b\"], \"delay_ms\": 5}\n{\"error\": \"boom\"}\n";
        assert_eq!(
            parse(script),
            Ok(vec![
                Response::Answer {
                    chunks: vec!["hi".into()],
                    delay: Duration::ZERO,
                    tool_calls: vec![],
                    usage: None
                },
                Response::Answer {
                    chunks: vec!["a".into(), "b".into()],
                    delay: Duration::from_millis(5),
                    tool_calls: vec![],
                    usage: None
                },
                Response::Error("boom".into()),
            ])
        );
    }

    #[test]
    fn tool_calls_carry_object_or_raw_arguments_and_usage() {
        let script = r#"{"tool_calls": [{"name": "clock"}, {"id": "x", "name": "clock", "arguments": "{bad"}], "text": "checking", "usage": {"input_tokens": 3, "output_tokens": 2}}"#;
        let calls = vec![
            ToolCall {
                call_id: "call_1_0".into(),
                name: "clock".into(),
                arguments: "{}".into(),
            },
            ToolCall {
                call_id: "x".into(),
                name: "clock".into(),
                arguments: "{bad".into(),
            },
        ];
        let usage = TokenUsage {
            input_tokens: 3,
            output_tokens: 2,
            ..TokenUsage::default()
        };
        assert_eq!(
            parse(script),
            Ok(vec![Response::Answer {
                chunks: vec!["checking".into()],
                delay: Duration::ZERO,
                tool_calls: calls,
                usage: Some(usage)
            }])
        );
        assert!(parse(r#"{"tool_calls": [{"name": "clock"}], "error": "no"}"#).is_err());
    }

    #[test]
    fn rejects_malformed_and_ambiguous_lines_with_their_number() {
        assert_eq!(parse("{\"text\": \"a\"}\nnot json").map_err(|(line, _)| line), Err(2));
        assert_eq!(
            parse("{\"text\": \"a\", \"error\": \"b\"}").map_err(|(line, _)| line),
            Err(1)
        );
        assert_eq!(parse("{\"txt\": \"a\"}").map_err(|(line, _)| line), Err(1));
    }

    #[test]
    fn summary_lines_answer_summary_requests_apart() {
        let (summaries, responses) =
            parse_all("{\"text\": \"a\"}\n{\"text\": \"sum\", \"summary\": true}\n{\"text\": \"b\"}").expect("parse");
        assert_eq!(summaries.len(), 1);
        assert_eq!(responses.len(), 2);
    }

    #[test]
    fn errors_never_quote_the_file() {
        let secret = "sk-live-0123456789abcdef";
        for text in [
            format!("{{\"{secret}\": 1}}"),
            format!("{{\"text\": {secret}}}"),
            format!("{{\"text\": \"a\", \"chunks\": \"{secret}\"}}"),
        ] {
            let (line, message) = parse(&text).expect_err(&text);
            assert_eq!(line, 1);
            assert!(!message.contains(secret), "{message}");
        }
    }

    #[test]
    fn only_small_regular_files_are_read() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("run mkfifo");
        assert!(made.success());
        let error = ScriptedModel::load(&fifo).expect_err("a FIFO").to_string();
        assert!(error.contains("not a regular file"), "{error}");
        let error = ScriptedModel::load("/dev/zero").expect_err("a device").to_string();
        assert!(error.contains("not a regular file"), "{error}");
        let big = dir.path().join("big.jsonl");
        let line = "{\"text\": \"x\"}\n";
        let count = usize::try_from(MAX_SCRIPT_BYTES).expect("size") / line.len() + 1;
        std::fs::write(&big, line.repeat(count)).expect("write");
        let error = ScriptedModel::load(&big).expect_err("too large").to_string();
        assert!(error.contains("larger than"), "{error}");
    }
}
