//! Test modules, one per area.

mod agent;
mod approvals;
mod cli;
mod compaction;
mod durable_submissions;
mod fuzz_seeds;
mod http_server;
mod log_paging;
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
mod support;
mod turns_with_tools;
mod web_ui;
mod workspace_race;
mod workspace_tools;
