//! A server's tools as Keel tools: listing them as the model sees them, and
//! a call's result as text.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};
use tokio::time::Instant;

use super::connection::Connection;
use super::{McpServer, naming};
use crate::{Tool, ToolContext, ToolError};
use keel_model::{BoxFuture, ToolSpec};

/// A remote tool as the model sees it.
#[derive(Debug)]
pub(super) struct RemoteTool {
    /// The server's name for it.
    pub(super) remote: String,
    pub(super) spec: ToolSpec,
    pub(super) read_only: bool,
}

/// Lists the tools of the server `name` on `connection`, before `deadline`
/// (`within` is the time that gave, for the error), as the model sees them.
pub(super) async fn list_tools(
    name: &str,
    connection: &Connection,
    deadline: Instant,
    within: Duration,
) -> Result<Vec<Arc<RemoteTool>>, String> {
    let listed = match tokio::time::timeout_at(deadline, connection.service.peer().list_all_tools()).await {
        Ok(Ok(listed)) => listed,
        Ok(Err(error)) => return Err(format!("listing its tools failed: {error}")),
        Err(_) => {
            return Err(format!(
                "it did not list its tools within {}",
                humantime::format_duration(within)
            ));
        }
    };
    let mut tools: Vec<Arc<RemoteTool>> = Vec::with_capacity(listed.len());
    for tool in listed {
        let spec_name = naming::tool_name(name, &tool.name);
        if tools.iter().any(|known| known.spec.name == spec_name) {
            tracing::warn!(server = name, tool = %tool.name, "the MCP server lists this tool twice; the first is kept");
            continue;
        }
        let (parameters, problem) = naming::parameters(&tool.input_schema);
        if let Some(problem) = problem {
            tracing::warn!(server = name, tool = %tool.name, "{problem}");
        }
        let description = tool
            .description
            .as_deref()
            .filter(|text| !text.trim().is_empty())
            .map(str::to_owned)
            .or_else(|| tool.title.clone())
            .unwrap_or_else(|| format!("The tool '{}' of the MCP server '{name}'.", tool.name));
        let read_only = tool
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.read_only_hint)
            .unwrap_or(false);
        tools.push(Arc::new(RemoteTool {
            remote: tool.name.into_owned(),
            spec: ToolSpec {
                name: spec_name,
                description,
                parameters,
            },
            read_only,
        }));
    }
    Ok(tools)
}

/// A remote tool, as a Keel tool.
pub(super) struct McpTool {
    pub(super) server: Arc<McpServer>,
    pub(super) tool: Arc<RemoteTool>,
}

impl Tool for McpTool {
    fn spec(&self) -> ToolSpec {
        self.tool.spec.clone()
    }

    fn read_only(&self) -> bool {
        self.tool.read_only
    }

    fn call<'a>(
        &'a self,
        arguments: serde_json::Map<String, serde_json::Value>,
        _context: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(self.server.call(&self.tool, arguments))
    }
}

/// A tool result as text for the model; an `isError` result is a failure.
pub(super) fn render(result: CallToolResult, server: &str, tool: &str) -> Result<String, ToolError> {
    let mut parts: Vec<String> = result.content.iter().map(describe).collect();
    if parts.is_empty()
        && let Some(structured) = &result.structured_content
    {
        parts.push(structured.to_string());
    }
    let text = parts.join("\n");
    if result.is_error == Some(true) {
        return Err(ToolError::Failed(if text.is_empty() {
            format!("the MCP server '{server}' reported that '{tool}' failed, without a message")
        } else {
            text
        }));
    }
    if text.is_empty() {
        return Ok("(the tool returned no content)".to_owned());
    }
    Ok(text)
}

/// One content block as text: text as it is, the rest as a placeholder line.
fn describe(block: &ContentBlock) -> String {
    match block {
        ContentBlock::Text(text) => text.text.clone(),
        ContentBlock::Image(image) => format!("[image: {}, {} bytes]", image.mime_type, decoded_len(&image.data)),
        ContentBlock::Audio(audio) => format!("[audio: {}, {} bytes]", audio.mime_type, decoded_len(&audio.data)),
        ContentBlock::Resource(resource) => match &resource.resource {
            ResourceContents::TextResourceContents { uri, text, .. } => format!("[resource: {uri}]\n{text}"),
            ResourceContents::BlobResourceContents {
                uri, mime_type, blob, ..
            } => format!(
                "[resource: {uri}, {}, {} bytes]",
                mime_type.as_deref().unwrap_or("binary"),
                decoded_len(blob)
            ),
            _ => "[resource of an unknown kind]".to_owned(),
        },
        ContentBlock::ResourceLink(link) => format!("[resource link: {} ({})]", link.uri, link.name),
        _ => "[content of an unknown type]".to_owned(),
    }
}

/// The size of base64 `data` once decoded.
fn decoded_len(data: &str) -> usize {
    let digits = data.bytes().filter(|byte| !byte.is_ascii_whitespace()).count();
    let padding = data.trim_end().bytes().rev().take_while(|byte| *byte == b'=').count();
    (digits * 3 / 4).saturating_sub(padding)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_sizes_are_counted_once_decoded() {
        assert_eq!(decoded_len(""), 0);
        assert_eq!(decoded_len("aGk="), 2);
        assert_eq!(decoded_len("aGVsbG8="), 5);
        assert_eq!(decoded_len("aGVs\nbG8h"), 6);
    }
}
