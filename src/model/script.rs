//! The scripted model: answers read from a JSON-lines file, one per model call.
//!
//! Each non-blank line is one response, used in order across the session's
//! model calls (the position is the session's durable call count, so it
//! survives a restart):
//!
//! - `{"text": "…"}`: the whole text, streamed as one delta;
//! - `{"chunks": ["Hel", "lo"], "delay_ms": 100}`: streamed chunk by chunk,
//!   pausing `delay_ms` before each;
//! - `{"error": "…"}`: the model call fails with that message.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::{BoxFuture, Model, ModelEvent, ModelEventSink, ModelOutput, ModelRequest};
use crate::{Error, Result};

/// One line of a script, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptLine {
    text: Option<String>,
    chunks: Option<Vec<String>>,
    delay_ms: Option<u64>,
    error: Option<String>,
}

/// One scripted response.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Response {
    Chunks { chunks: Vec<String>, delay: Duration },
    Error(String),
}

/// A [`Model`] that plays back a script file.
#[derive(Debug, Clone)]
pub struct ScriptedModel {
    path: PathBuf,
    responses: Vec<Response>,
}

impl ScriptedModel {
    /// Reads and checks the whole script, so a bad line is reported before
    /// any session work starts.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|error| Error::Config(format!("cannot read script {}: {error}", path.display())))?;
        let responses = parse(&text)
            .map_err(|(line, error)| Error::Config(format!("script {} line {line}: {error}", path.display())))?;
        if responses.is_empty() {
            return Err(Error::Config(format!("script {} has no responses", path.display())));
        }
        Ok(Self {
            path: path.to_path_buf(),
            responses,
        })
    }
}

fn parse(text: &str) -> std::result::Result<Vec<Response>, (usize, String)> {
    let mut responses = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let number = index + 1;
        let parsed: ScriptLine = serde_json::from_str(line).map_err(|error| (number, error.to_string()))?;
        let delay = Duration::from_millis(parsed.delay_ms.unwrap_or(0));
        let response = match (parsed.text, parsed.chunks, parsed.error) {
            (Some(text), None, None) => Response::Chunks {
                chunks: vec![text],
                delay,
            },
            (None, Some(chunks), None) => Response::Chunks { chunks, delay },
            (None, None, Some(error)) => Response::Error(error),
            _ => {
                return Err((
                    number,
                    "expected exactly one of \"text\", \"chunks\" or \"error\"".into(),
                ));
            }
        };
        responses.push(response);
    }
    Ok(responses)
}

impl Model for ScriptedModel {
    fn respond<'a>(&'a self, request: ModelRequest<'a>, events: ModelEventSink) -> BoxFuture<'a, Result<ModelOutput>> {
        Box::pin(async move {
            let index = usize::try_from(request.call_index).unwrap_or(usize::MAX);
            let Some(response) = self.responses.get(index) else {
                return Err(Error::Model(format!(
                    "script {} is exhausted: it has {} responses and this is model call {}",
                    self.path.display(),
                    self.responses.len(),
                    request.call_index + 1
                )));
            };
            match response {
                Response::Error(message) => Err(Error::Model(message.clone())),
                Response::Chunks { chunks, delay } => {
                    let mut text = String::new();
                    for chunk in chunks {
                        if !delay.is_zero() {
                            tokio::time::sleep(*delay).await;
                        }
                        events(ModelEvent::TextDelta(chunk.clone()))?;
                        text.push_str(chunk);
                    }
                    Ok(ModelOutput::text(text))
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
                Response::Chunks {
                    chunks: vec!["hi".into()],
                    delay: Duration::ZERO
                },
                Response::Chunks {
                    chunks: vec!["a".into(), "b".into()],
                    delay: Duration::from_millis(5)
                },
                Response::Error("boom".into()),
            ])
        );
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
}
