//! Tools the client executes, in the native API: checking a session's
//! declaration (`client_tools` at creation or in a `PATCH`, a bot's in
//! keel.toml), and checking a `client_tool_result` before anything is
//! stored for it, from the session's live status or its stored summary and
//! log, so the answer is the same on every node and whether or not the
//! session is loaded. The runtime refuses what slips past (a race with a
//! timeout or a second answer) as `submission_rejected`.

use std::ops::ControlFlow;

use crate::Server;
use crate::error::ApiError;
use keel_config::KeelConfig;
use keel_protocol::{ClientToolSpec, EventMsg, MAX_CLIENT_TOOL_OUTPUT_BYTES, Op};
use keel_store::walk_back;
use keel_tools::client::{ClientToolError, check_client_tools, complete_client_tools, server_tool_names};

/// How far back the log is read to tell a call answered already from one
/// that never waited: a call requested longer ago is told "not waiting".
const ANSWERED_LOOKBACK_EVENTS: usize = 20_000;

/// Completes and checks `tools` as the client tools of a session of this
/// server: their own rules, and no name of a tool the server runs (a
/// built-in tool, or a tool of one of its MCP servers, `{server}__{tool}`).
pub(crate) fn check_declared(keel: &KeelConfig, tools: &mut [ClientToolSpec]) -> Result<(), ApiError> {
    if tools.is_empty() {
        // Nothing to check (most requests), without listing the tool set.
        return Ok(());
    }
    complete_client_tools(tools);
    let builtin = server_tool_names();
    let mcp_prefixes: Vec<String> = keel.mcp.servers.keys().map(|name| format!("{name}__")).collect();
    let is_server_tool = |name: &str| {
        builtin.iter().any(|taken| taken == name) || mcp_prefixes.iter().any(|prefix| name.starts_with(prefix))
    };
    check_client_tools(tools, is_server_tool).map_err(|error| match error {
        ClientToolError::Invalid(message) => ApiError::ClientTool {
            code: "invalid_client_tool",
            message,
        },
        ClientToolError::Conflict(message) => ApiError::ClientTool {
            code: "client_tool_conflict",
            message,
        },
    })
}

/// Refuses a `client_tool_result` whose output is over the cap (`413`),
/// whose call does not wait for a result (`404 unknown_tool_call`) or was
/// answered already (`409 tool_call_answered`). Other ops pass.
pub(crate) async fn check_result(server: &Server, session_id: &str, op: &Op) -> Result<(), ApiError> {
    let Op::ClientToolResult { call_id, output, .. } = op else {
        return Ok(());
    };
    if output.len() > MAX_CLIENT_TOOL_OUTPUT_BYTES {
        return Err(ApiError::ClientTool {
            code: "client_tool_output_too_large",
            message: format!(
                "the result is {} bytes; a client tool's result may be at most {MAX_CLIENT_TOOL_OUTPUT_BYTES}",
                output.len()
            ),
        });
    }
    if waiting(server, session_id, call_id).await? {
        return Ok(());
    }
    if requested_before(server, session_id, call_id).await? {
        return Err(ApiError::ClientTool {
            code: "tool_call_answered",
            message: format!(
                "client tool call '{call_id}' was already answered (by a result, a timeout or an interrupt)"
            ),
        });
    }
    Err(ApiError::ClientTool {
        code: "unknown_tool_call",
        message: format!("no client tool call '{call_id}' is waiting for a result in session '{session_id}'"),
    })
}

/// Whether the call waits for the client: says the live session when this
/// node runs it, else the stored summary (written with the request).
async fn waiting(server: &Server, session_id: &str, call_id: &str) -> Result<bool, ApiError> {
    if let Some(status) = server.host.status(session_id)
        && status.awaiting_client.iter().any(|waiting| waiting == call_id)
    {
        return Ok(true);
    }
    let summary = server.host.store.session_summary(session_id).await?;
    Ok(summary.is_some_and(|summary| summary.awaiting_client.iter().any(|waiting| waiting == call_id)))
}

/// Whether the log has a `client_tool_requested` for the call (in its
/// newest [`ANSWERED_LOOKBACK_EVENTS`] events).
async fn requested_before(server: &Server, session_id: &str, call_id: &str) -> Result<bool, ApiError> {
    let mut found = false;
    let mut read = 0usize;
    walk_back(server.host.store.as_ref(), session_id, |event| {
        read += 1;
        if let EventMsg::ClientToolRequested(requested) = &event.msg
            && requested.call_id == call_id
        {
            found = true;
            return ControlFlow::Break(());
        }
        if read >= ANSWERED_LOOKBACK_EVENTS {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    })
    .await?;
    Ok(found)
}
