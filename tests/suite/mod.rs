//! Test modules, one per area.

mod agent;
mod approvals;
mod chaos;
mod cli;
mod compaction;
mod durable_submissions;
mod http_server;
mod mcp;
mod provider_anthropic;
mod provider_http;
mod provider_openai_chat;
mod provider_openai_responses;
mod provider_support;
mod provider_tool_turns;
mod regenerate;
mod sandbox;
mod server;
mod skip;
mod step_limits;
mod store_faults;
mod support;
mod turns_with_tools;
mod web_ui;
mod workspace_race;
mod workspace_tools;
