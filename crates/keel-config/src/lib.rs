//! Configuration: `keel.toml`, model specs, tools and MCP servers.
//!
//! A model is named by a spec: `script:FILE`, `openai:MODEL` (Chat
//! Completions), `openai-responses:MODEL`, `anthropic:MODEL`,
//! `ollama:MODEL` (Chat Completions on `http://localhost:11434/v1`, no key),
//! or the name of a model defined in `keel.toml`. Any spec may end in
//! options, `?KEY=VALUE&…` (`max_output_tokens`, `temperature`,
//! `context_window`, `compact_threshold`, `idle_timeout_secs`, `max_retries`), as in
//! `openai:gpt-4.1-mini?max_output_tokens=1024`; they override the entry's.
//!
//! ```toml
//! model = "fast"                    # the default spec
//!
//! [models.fast]
//! provider = "openai"               # openai | openai-responses | anthropic | ollama | script
//! model = "gpt-4.1-mini"
//! base_url = "https://api.openai.com/v1"
//! api_key_env = "OPENAI_API_KEY"
//! headers = { "OpenAI-Organization" = "org-123" }
//! context_window = 128000             # tokens (default: known for gpt-4.1, gpt-4o, gpt-5, o3, o4, claude, …)
//! compact_threshold = 0.8           # compact the history past this share of the window (default 0.8)
//! max_output_tokens = 4096
//! temperature = 0.2
//! idle_timeout_secs = 300           # longest silence in a stream (default 300)
//! response_timeout_secs = 120       # wait for response headers, per request (default 120)
//! step_timeout_secs = 1800          # a whole step: all retries and the stream (default 1800)
//! max_retries = 4                   # before anything was streamed (default 4)
//! ```
//!
//! MCP tool servers are started for each session (see [`keel_tools::mcp`]);
//! each is a child process spoken to over stdio, or a streamable-HTTP URL:
//!
//! ```toml
//! [mcp.servers.files]               # tools are named files__<tool>
//! command = "npx"                   # run as a child process (stdio)
//! args = ["-y", "@modelcontextprotocol/server-filesystem", "."]
//! env = { LOG_LEVEL = "warn" }      # added to PATH, HOME, … (nothing else is inherited)
//! cwd = "."                         # relative to the session's workspace (the default)
//! timeout_secs = 60                 # per call (default 60)
//! startup_timeout_secs = 30         # start, handshake, tool list (default 30)
//!
//! [mcp.servers.search]
//! url = "https://mcp.example.com/mcp"   # streamable HTTP instead of `command`
//! headers = { Authorization = "Bearer …" }
//! enabled = false                   # keep the entry, start nothing (default true)
//! ```
//!
//! The built-in tools, the shell's sandbox and the approval policies:
//!
//! ```toml
//! [tools]
//! builtin = true                    # clock and the reading workspace tools (default true)
//! write = true                      # write_file, edit_file (default true)
//! shell = true                      # shell (default true)
//! sandbox = "workspace-write"       # read-only | workspace-write | full-access
//! shell_timeout_secs = 60           # per command unless the call asks for more
//! shell_max_timeout_secs = 600      # the most a call may ask for
//! network = false                   # whether shell commands may use the network (default false)
//!
//! [approvals]
//! default = "ask"                   # auto | ask | deny; unset: reading tools auto, others ask
//! tools = { shell = "ask", write_file = "auto", files__read_file = "auto" }
//! ```
//!
//! What API clients of `keel serve` may ask for when they create a session
//! (the ceiling; `keel serve` flags override each key). The operator's own
//! `[tools]`, `[approvals]` and models are not limited by it; a client may
//! not turn on a tool `[tools]` turned off. A request beyond it is refused
//! with `403`:
//!
//! ```toml
//! [server]
//! max_sandbox = "workspace-write"   # the loosest `tools.sandbox` a client may ask for (--max-sandbox)
//! auto_approve = ["clock", "read_file", "list_dir", "search"]  # tools a client may set to auto; "*" for all (--auto-approve)
//! allow_network = false             # whether a client may turn `tools.network` on (--allow-network)
//! script_dir = "scripts"            # `script:` models from clients only from here (--script-dir); unset: none
//! ```
//!
//! The defaults of one bot's sessions (a session names its bot with
//! `bot_id`; see [`BotConfig`]). A session keeps what it was created with:
//!
//! ```toml
//! [bots.support]
//! coding_agent = false              # no coding prompt, no AGENTS.md, built-in tools off, one turn per message
//! instructions = "You answer customers of Example Inc. in one paragraph."
//! model = "fast"                    # when the request names none
//! queue_mode = "each"               # merge | each (default: merge for coding agents, each otherwise)
//! ```
//!
//! Keys come from the environment (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`, or
//! the entry's `api_key_env`); endpoints from the entry, then
//! `OPENAI_BASE_URL` / `ANTHROPIC_BASE_URL`, then the providers' defaults.
//! The official endpoints need a key; a model on a custom `base_url` needs
//! one only if its entry names an `api_key_env`. Keys are never written to
//! the log, the checkpoint or a log line: as the file is loaded, every key
//! it names, every `[models]` header and every MCP `env` and `headers`
//! value is registered with [`keel_secrets`], which replaces it
//! (and echoed credential headers) in everything a session stores and in
//! API errors, whether or not its model or server is ever used.
//!
//! This crate turns a file into the values the other crates take (models,
//! tool sets, approval rules, the server's ceiling); it must not know HTTP or
//! the store (no dependency on `keel-server` or `keel-store`), and the crates
//! below it must not know it: each tool owns the types of its own table.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use keel_model::{Model, ScriptedModel};
use keel_protocol::{Error, Result};
use keel_providers::http::Secret;
use keel_providers::{ProviderKind, ProviderSettings};
use keel_tools::ApprovalRules;

mod auth;
mod bots;
mod budget;
mod server;
mod session;
mod telemetry;
mod tenants;
mod webhooks;

pub use self::auth::{AuthConfig, DEFAULT_JWKS_REFRESH_SECS, DEFAULT_JWT_LEEWAY_SECS, JwtConfig};
pub use self::bots::{BotConfig, BotId, Bots};
pub use self::budget::BudgetConfig;
pub use self::server::{READING_TOOLS, ServerPolicy};
pub use self::telemetry::TelemetryConfig;
pub use self::tenants::{MAX_TENANT_BYTES, TENANT_NAME_RULE, TenantConfig, TenantTools, valid_tenant};
pub use self::webhooks::{WebhookEndpointConfig, WebhooksConfig};
pub use keel_tools::ToolsConfig;
pub use keel_tools::mcp::{
    DEFAULT_MCP_CALL_TIMEOUT, DEFAULT_MCP_STARTUP_TIMEOUT, MAX_MCP_SERVER_NAME, McpConfig, McpServerConfig,
    McpTransport, check_mcp_server_name,
};

/// The contents of `keel.toml`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeelConfig {
    /// The model spec used when none is given.
    pub model: Option<String>,
    /// Named models.
    #[serde(default)]
    pub models: BTreeMap<String, ModelEntry>,
    /// MCP tool servers (`[mcp.servers.NAME]`).
    #[serde(default)]
    pub mcp: McpConfig,
    /// The built-in tools and the shell's sandbox (`[tools]`).
    #[serde(default)]
    pub tools: ToolsConfig,
    /// Which tool calls run at once, ask the user, or are refused
    /// (`[approvals]`).
    #[serde(default)]
    pub approvals: ApprovalRules,
    /// What API clients of `keel serve` may ask for (`[server]`).
    #[serde(default)]
    pub server: ServerPolicy,
    /// The defaults of each bot's sessions (`[bots.<id>]`).
    #[serde(default)]
    pub bots: Bots,
    /// API keys' and JWTs' settings (`[auth]`).
    #[serde(default)]
    pub auth: AuthConfig,
    /// Each tenant's ceiling and budget (`[tenants.<id>]`).
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantConfig>,
    /// Where webhooks may go and the operator's endpoints (`[webhooks]`).
    #[serde(default)]
    pub webhooks: WebhooksConfig,
    /// Where traces are exported (`[telemetry]`).
    #[serde(default)]
    pub telemetry: TelemetryConfig,
}

/// A named model in `keel.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// `openai`, `openai-responses`, `anthropic`, `ollama` or `script`.
    pub provider: String,
    /// The provider's model name (or, for `script`, the script file).
    pub model: String,
    /// The API's base URL.
    pub base_url: Option<String>,
    /// The environment variable holding the API key.
    pub api_key_env: Option<String>,
    /// Extra request headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The model's context window, in tokens.
    pub context_window: Option<u32>,
    /// The share of the context window (above 0, at most 1) past which the
    /// history is compacted before a request.
    pub compact_threshold: Option<f64>,
    /// The most tokens to generate per request.
    pub max_output_tokens: Option<u32>,
    /// Sampling temperature.
    pub temperature: Option<f64>,
    /// Longest silence in a streamed response, in seconds.
    pub idle_timeout_secs: Option<u64>,
    /// Longest wait for the response headers of one request, in seconds.
    pub response_timeout_secs: Option<u64>,
    /// Longest a model step may take, every retry and the whole stream
    /// included, in seconds.
    pub step_timeout_secs: Option<u64>,
    /// Retries of a failed request (before anything was streamed).
    pub max_retries: Option<u32>,
}

impl KeelConfig {
    /// Reads and checks a config file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| Error::Config(format!("cannot read {}: {error}", path.display())))?;
        Self::parse(&text, path)
    }

    /// Parses and checks the text of a config file; `path` names it in
    /// errors (nothing is read from it).
    /// Every secret the file holds (its `[models]` headers, its MCP
    /// servers' `env` and `headers`) and the API keys it names are
    /// registered with [`keel_secrets`] here, before any model
    /// is built or server started, so that no session can store one.
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let config: Self = toml::from_str(text).map_err(|error| {
            let message = error.message().trim_end();
            // `FILE:LINE:COLUMN: message`, the form editors and terminals
            // jump to.
            match error.span() {
                Some(span) => {
                    let (line, column) = line_and_column(text, span.start);
                    // The line itself, since serde's messages do not always
                    // name the key ("invalid type: string, expected f64").
                    let source: String = text
                        .lines()
                        .nth(line - 1)
                        .unwrap_or_default()
                        .trim()
                        .chars()
                        .take(80)
                        .collect();
                    Error::Config(format!("{}:{line}:{column}: {message} (in `{source}`)", path.display()))
                }
                None => Error::Config(format!("{}: {message}", path.display())),
            }
        })?;
        config.register_secrets(&process_env);
        Ok(config)
    }

    /// Registers with [`keel_secrets`] every secret this config
    /// holds or names: each `[models]` header value, each entry's API key
    /// (the variable `api_key_env` names, or its provider's usual one) and
    /// the usual key variables of every provider, as `env` reads them. The
    /// MCP servers' `env` and `headers` values were registered as they were
    /// parsed (see [`McpConfig`]).
    pub fn register_secrets(&self, env: &dyn Fn(&str) -> Option<String>) {
        use keel_secrets::register;
        let mut variables: Vec<&str> = ProviderKind::key_variables();
        for entry in self.models.values() {
            entry.headers.values().for_each(|value| register(value));
            if let Some(variable) = &entry.api_key_env {
                variables.push(variable);
            }
        }
        for variable in variables {
            if let Some(key) = env(variable) {
                register(&key);
            }
        }
    }

    /// The config in use: `explicit` if given (it must exist), else
    /// `KEEL_CONFIG`, else `./keel.toml`, else `<config dir>/keel/keel.toml`,
    /// else an empty one. Returns where it came from.
    pub fn discover(explicit: Option<&Path>) -> Result<(Self, Option<PathBuf>)> {
        if let Some(path) = explicit {
            return Ok((Self::load(path)?, Some(path.to_path_buf())));
        }
        if let Some(path) = std::env::var_os("KEEL_CONFIG") {
            let path = PathBuf::from(path);
            return Ok((Self::load(&path)?, Some(path)));
        }
        let candidates = [
            Some(PathBuf::from("keel.toml")),
            dirs::config_dir().map(|dir| dir.join("keel/keel.toml")),
        ];
        for path in candidates.into_iter().flatten() {
            if path.is_file() {
                return Ok((Self::load(&path)?, Some(path)));
            }
        }
        let config = Self::default();
        config.register_secrets(&process_env);
        Ok((config, None))
    }

    /// Builds the model named by `spec`, reading keys and endpoints from the
    /// process environment. Fails with a one-line [`Error::Config`].
    pub fn model(&self, spec: &str) -> Result<Arc<dyn Model>> {
        self.model_with_env(spec, &process_env)
    }

    /// [`Self::model`] with the environment given as a lookup.
    pub fn model_with_env(&self, spec: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Arc<dyn Model>> {
        // Options after `?` apply to any spec, so that an `openai:` spec can
        // be capped without a keel.toml entry.
        let (spec, options) = match spec.split_once('?') {
            Some((base, options)) => (base, Some(options)),
            None => (spec, None),
        };
        let (name, mut entry) = match spec.split_once(':') {
            Some((provider, model)) => {
                if model.is_empty() {
                    return Err(Error::Config(format!(
                        "model spec '{spec}' names no model after '{provider}:'"
                    )));
                }
                let entry = ModelEntry {
                    provider: provider.to_owned(),
                    model: model.to_owned(),
                    base_url: None,
                    api_key_env: None,
                    headers: BTreeMap::new(),
                    context_window: None,
                    compact_threshold: None,
                    max_output_tokens: None,
                    temperature: None,
                    idle_timeout_secs: None,
                    response_timeout_secs: None,
                    step_timeout_secs: None,
                    max_retries: None,
                };
                (provider.to_owned(), entry)
            }
            None => match self.models.get(spec) {
                Some(entry) => (spec.to_owned(), entry.clone()),
                None => {
                    let known: Vec<&str> = self.models.keys().map(String::as_str).collect();
                    let known = if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    };
                    return Err(Error::Config(format!(
                        "unknown model '{spec}': write provider:model ({}, script) or a model named in keel.toml \
                         (known: {known})",
                        ProviderKind::names()
                    )));
                }
            },
        };
        // Parsed once here; an unknown provider is reported after what is
        // wrong with the options.
        let source = Source::parse(&entry.provider);
        if let Some(options) = options {
            apply_options(
                &mut entry,
                source.as_ref().is_ok_and(|source| *source == Source::Script),
                options,
            )?;
        }
        build(spec, &name, &entry, source?, env)
    }
}

/// A variable of the process environment; unset and empty are the same.
fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

/// The 1-based line and column (in characters) of byte `offset` in `text`.
fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |index| index + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

/// The options a spec may carry after `?`, as `KEY=VALUE` joined with `&`.
const SPEC_OPTIONS: &str =
    "max_output_tokens, temperature, context_window, compact_threshold, idle_timeout_secs, max_retries";

/// Sets the options of a spec (`max_output_tokens=1024&temperature=0.2`) on
/// `entry`, over what a keel.toml entry says.
fn apply_options(entry: &mut ModelEntry, script: bool, options: &str) -> Result<()> {
    if script {
        return Err(Error::Config("a script: model takes no options".to_owned()));
    }
    fn number<T: std::str::FromStr>(key: &str, value: &str) -> Result<T> {
        value
            .parse()
            .map_err(|_| Error::Config(format!("model option {key}={value:?} is not a valid number")))
    }
    for option in options.split('&').filter(|option| !option.is_empty()) {
        let Some((key, value)) = option.split_once('=') else {
            return Err(Error::Config(format!(
                "model option '{option}' has no value: write KEY=VALUE ({SPEC_OPTIONS})"
            )));
        };
        match key {
            "max_output_tokens" => entry.max_output_tokens = Some(number(key, value)?),
            "temperature" => entry.temperature = Some(number(key, value)?),
            "context_window" => entry.context_window = Some(number(key, value)?),
            "compact_threshold" => entry.compact_threshold = Some(number(key, value)?),
            "idle_timeout_secs" => entry.idle_timeout_secs = Some(number(key, value)?),
            "max_retries" => entry.max_retries = Some(number(key, value)?),
            other => {
                return Err(Error::Config(format!(
                    "unknown model option '{other}' (known: {SPEC_OPTIONS})"
                )));
            }
        }
    }
    Ok(())
}

/// Where a model comes from: a script file, or a provider's API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// `script:FILE`, replayed by [`ScriptedModel`].
    Script,
    /// A provider over HTTP.
    Provider(ProviderKind),
}

impl Source {
    /// The source an entry's `provider` names: the one place it is parsed.
    fn parse(provider: &str) -> Result<Self> {
        if provider == "script" {
            return Ok(Source::Script);
        }
        provider.parse().map(Source::Provider).map_err(|_| {
            Error::Config(format!(
                "unknown model provider '{provider}' (known: {}, script)",
                ProviderKind::names()
            ))
        })
    }
}

/// Builds a model from an entry (`spec` is what named it, for errors).
fn build(
    spec: &str,
    name: &str,
    entry: &ModelEntry,
    source: Source,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Arc<dyn Model>> {
    let kind = match source {
        Source::Script => return Ok(Arc::new(ScriptedModel::load(&entry.model)?)),
        Source::Provider(kind) => kind,
    };
    let profile = kind.profile();
    let custom_base = entry.base_url.clone().or_else(|| profile.base_url_env.and_then(env));
    let base_url = custom_base.clone().unwrap_or_else(|| profile.base_url.to_owned());
    let key_variable = entry.api_key_env.clone().unwrap_or_else(|| profile.key_env.to_owned());
    let api_key = env(&key_variable).map(Secret::new);
    // The official endpoints always need a key; elsewhere only if asked for.
    let key_required = (profile.needs_key && custom_base.is_none()) || entry.api_key_env.is_some();
    if api_key.is_none() && key_required {
        let other_variable = if entry.api_key_env.is_some() {
            ""
        } else {
            " (or name another variable with api_key_env in keel.toml)"
        };
        return Err(Error::Config(format!(
            "model '{spec}' ({} provider) needs an API key: set {key_variable} in the environment{other_variable}",
            entry.provider
        )));
    }
    let mut settings = ProviderSettings::new(name, &entry.model, base_url);
    settings.api_key = api_key;
    settings.headers = entry
        .headers
        .iter()
        .map(|(key, value)| (key.clone(), Secret::new(value.clone())))
        .collect();
    settings.max_output_tokens = entry.max_output_tokens;
    settings.temperature = entry.temperature;
    settings.context_window = entry.context_window;
    if let Some(threshold) = entry.compact_threshold {
        if !(threshold > 0.0 && threshold <= 1.0) {
            return Err(Error::Config(format!(
                "model '{name}': compact_threshold is a share of the context window, above 0 and at most 1 (got {threshold})"
            )));
        }
        settings.compact_threshold = threshold;
    }
    if let Some(seconds) = entry.idle_timeout_secs {
        settings.http.idle_timeout = Duration::from_secs(seconds);
    }
    if let Some(seconds) = entry.response_timeout_secs {
        settings.http.response_timeout = Duration::from_secs(seconds);
    }
    if let Some(seconds) = entry.step_timeout_secs {
        settings.http.step_timeout = Duration::from_secs(seconds);
    }
    if let Some(retries) = entry.max_retries {
        settings.http.retry.max_retries = retries;
    }
    kind.build(settings)
}

#[cfg(test)]
mod tests;
