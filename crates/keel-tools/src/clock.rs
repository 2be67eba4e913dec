//! `clock`: the current time, the one thing a model cannot know.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{Tool, ToolContext, ToolError};
use keel_model::{BoxFuture, ToolSpec};

/// Tells the current UTC time.
#[derive(Debug, Clone, Copy, Default)]
pub struct Clock;

impl Tool for Clock {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "clock".into(),
            description: "Returns the current date and time in UTC (RFC 3339) and as Unix milliseconds.".into(),
            parameters: crate::object_schema(serde_json::json!({}), &[]),
        }
    }

    fn read_only(&self) -> bool {
        true
    }

    fn call<'a>(
        &'a self,
        arguments: serde_json::Map<String, serde_json::Value>,
        _context: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            if let Some(unexpected) = arguments.keys().next() {
                return Err(ToolError::InvalidArguments(format!(
                    "clock takes no arguments, got '{unexpected}'"
                )));
            }
            let now = SystemTime::now();
            let unix_ms = now.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_millis();
            let utc = humantime::format_rfc3339_millis(now).to_string();
            Ok(serde_json::json!({"utc": utc, "unix_ms": unix_ms}).to_string())
        })
    }
}
