//! Tools the client executes: declared by a session, called by the model,
//! answered by the client with a `client_tool_result` op while the turn
//! waits durably.

mod agent;
mod http;
