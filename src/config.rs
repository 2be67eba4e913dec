//! Configuration: `keel.toml` and model specs.
//!
//! A model is named by a spec: `script:FILE`, `openai:MODEL` (Chat
//! Completions), `openai-responses:MODEL`, `anthropic:MODEL`,
//! `ollama:MODEL` (Chat Completions on `http://localhost:11434/v1`, no key),
//! or the name of a model defined in `keel.toml`:
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
//! context_window = 128000
//! max_output_tokens = 4096
//! temperature = 0.2
//! ```
//!
//! MCP tool servers are started for each session (see [`crate::tools::mcp`]);
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
//! Keys come from the environment (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`, or
//! the entry's `api_key_env`); endpoints from the entry, then
//! `OPENAI_BASE_URL` / `ANTHROPIC_BASE_URL`, then the providers' defaults.
//! The official endpoints need a key; a model on a custom `base_url` needs
//! one only if its entry names an `api_key_env`. Keys are never written to
//! the log, the checkpoint or a log line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::model::{Model, ScriptedModel};
use crate::provider::http::Secret;
use crate::provider::{ProviderSettings, anthropic, openai_chat, openai_responses};
use crate::{Error, Result};

const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
const ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com";
const OLLAMA_BASE_URL: &str = "http://localhost:11434/v1";

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
    /// The most tokens to generate per request.
    pub max_output_tokens: Option<u32>,
    /// Sampling temperature.
    pub temperature: Option<f64>,
    /// Longest silence in a streamed response, in seconds.
    pub idle_timeout_secs: Option<u64>,
    /// Retries of a failed request (before anything was streamed).
    pub max_retries: Option<u32>,
}

impl KeelConfig {
    /// Reads and checks a config file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| Error::Config(format!("cannot read {}: {error}", path.display())))?;
        toml::from_str(&text).map_err(|error| {
            let message = error.message().to_owned();
            Error::Config(format!("{}: {message}", path.display()))
        })
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
        Ok((Self::default(), None))
    }

    /// Builds the model named by `spec`, reading keys and endpoints from the
    /// process environment. Fails with a one-line [`Error::Config`].
    pub fn model(&self, spec: &str) -> Result<Arc<dyn Model>> {
        self.model_with_env(spec, &|name| std::env::var(name).ok().filter(|value| !value.is_empty()))
    }

    /// [`Self::model`] with the environment given as a lookup.
    pub fn model_with_env(&self, spec: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Arc<dyn Model>> {
        let (name, entry) = match spec.split_once(':') {
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
                    max_output_tokens: None,
                    temperature: None,
                    idle_timeout_secs: None,
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
                        "unknown model '{spec}': write provider:model (openai, openai-responses, anthropic, ollama, \
                         script) or a model named in keel.toml (known: {known})"
                    )));
                }
            },
        };
        build(&name, &entry, env)
    }
}

/// Builds a model from an entry.
fn build(name: &str, entry: &ModelEntry, env: &dyn Fn(&str) -> Option<String>) -> Result<Arc<dyn Model>> {
    let (default_base, base_env, key_env, needs_key) = match entry.provider.as_str() {
        "script" => return Ok(Arc::new(ScriptedModel::load(&entry.model)?)),
        "openai" | "openai-responses" => (OPENAI_BASE_URL, Some("OPENAI_BASE_URL"), "OPENAI_API_KEY", true),
        "anthropic" => (
            ANTHROPIC_BASE_URL,
            Some("ANTHROPIC_BASE_URL"),
            "ANTHROPIC_API_KEY",
            true,
        ),
        "ollama" => (OLLAMA_BASE_URL, None, "OLLAMA_API_KEY", false),
        other => {
            return Err(Error::Config(format!(
                "unknown model provider '{other}' (known: openai, openai-responses, anthropic, ollama, script)"
            )));
        }
    };
    let custom_base = entry.base_url.clone().or_else(|| base_env.and_then(env));
    let base_url = custom_base.clone().unwrap_or_else(|| default_base.to_owned());
    let key_variable = entry.api_key_env.clone().unwrap_or_else(|| key_env.to_owned());
    let api_key = env(&key_variable).map(Secret::new);
    // The official endpoints always need a key; elsewhere only if asked for.
    let key_required = (needs_key && custom_base.is_none()) || entry.api_key_env.is_some();
    if api_key.is_none() && key_required {
        return Err(Error::Config(format!(
            "model '{name}' needs an API key: set {key_variable}"
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
    if let Some(seconds) = entry.idle_timeout_secs {
        settings.http.idle_timeout = Duration::from_secs(seconds);
    }
    if let Some(retries) = entry.max_retries {
        settings.http.retry.max_retries = retries;
    }
    Ok(match entry.provider.as_str() {
        "openai-responses" => Arc::new(openai_responses::OpenAiResponses::new(settings)?),
        "anthropic" => Arc::new(anthropic::Anthropic::new(settings)?),
        _ => Arc::new(openai_chat::OpenAiChat::new(settings)?),
    })
}

/// How long one MCP tool call may take by default.
pub const DEFAULT_MCP_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// How long an MCP server may take by default to start, finish the
/// handshake and list its tools.
pub const DEFAULT_MCP_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest MCP server name; the name prefixes its tools' names, which
/// providers limit to 64 characters.
pub const MAX_MCP_SERVER_NAME: usize = 32;

/// Headers the streamable-HTTP transport sets itself.
const RESERVED_MCP_HEADERS: [&str; 4] = ["accept", "mcp-session-id", "mcp-protocol-version", "last-event-id"];

/// `[mcp]` in `keel.toml`: the MCP tool servers each session starts.
///
/// Parsing checks every entry, so a bad one fails [`KeelConfig::load`] with
/// a one-line message naming the server.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(try_from = "RawMcpConfig")]
pub struct McpConfig {
    /// The servers by name. The name prefixes the server's tools:
    /// `{name}__{tool}`.
    pub servers: BTreeMap<String, McpServerConfig>,
}

/// One MCP server: how to reach it and how long to wait for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpServerConfig {
    /// A child process or a URL.
    pub transport: McpTransport,
    /// The longest one tool call may take (a call that first restarts the
    /// stopped server may also take the startup timeout).
    pub timeout: Duration,
    /// The longest the server may take to start, finish the handshake and
    /// list its tools.
    pub startup_timeout: Duration,
    /// Whether sessions start it.
    pub enabled: bool,
}

/// How Keel talks to an MCP server.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum McpTransport {
    /// A child process speaking JSON-RPC over its stdin and stdout.
    Stdio {
        /// The program (looked up in `PATH` when it has no slash).
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Variables set for it, on top of the few it inherits (`PATH`,
        /// `HOME`, `USER`, …; never the runtime's API keys).
        env: BTreeMap<String, String>,
        /// Where it runs; a relative path is taken from the session's
        /// workspace, which is also the default.
        cwd: Option<PathBuf>,
    },
    /// A streamable-HTTP endpoint.
    Http {
        /// The endpoint, `http://` or `https://`.
        url: String,
        /// Headers sent with every request (for example `Authorization`).
        headers: BTreeMap<String, String>,
    },
}

impl std::fmt::Debug for McpTransport {
    /// Variable values and header values may be secrets: only their names
    /// are shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Stdio {
                command,
                args,
                env,
                cwd,
            } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("args", args)
                .field("env", &env.keys().collect::<Vec<_>>())
                .field("cwd", cwd)
                .finish(),
            Self::Http { url, headers } => f
                .debug_struct("Http")
                .field("url", url)
                .field("headers", &headers.keys().collect::<Vec<_>>())
                .finish(),
        }
    }
}

impl McpServerConfig {
    /// A child process run as `command args…`, with the default timeouts.
    pub fn stdio(command: impl Into<String>, args: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self::with_transport(McpTransport::Stdio {
            command: command.into(),
            args: args.into_iter().map(Into::into).collect(),
            env: BTreeMap::new(),
            cwd: None,
        })
    }

    /// A streamable-HTTP endpoint, with the default timeouts.
    pub fn http(url: impl Into<String>) -> Self {
        Self::with_transport(McpTransport::Http {
            url: url.into(),
            headers: BTreeMap::new(),
        })
    }

    fn with_transport(transport: McpTransport) -> Self {
        Self {
            transport,
            timeout: DEFAULT_MCP_CALL_TIMEOUT,
            startup_timeout: DEFAULT_MCP_STARTUP_TIMEOUT,
            enabled: true,
        }
    }

    /// Checks the entry named `name`; the message is one line.
    pub fn check(&self, name: &str) -> std::result::Result<(), String> {
        check_mcp_server_name(name)?;
        if self.timeout.is_zero() || self.startup_timeout.is_zero() {
            return Err("timeouts must be at least 1 second".to_owned());
        }
        match &self.transport {
            McpTransport::Stdio { command, args, env, .. } => {
                if command.trim().is_empty() {
                    return Err("`command` is empty".to_owned());
                }
                if command.contains('\0') || args.iter().any(|arg| arg.contains('\0')) {
                    return Err("`command` and `args` cannot contain NUL characters".to_owned());
                }
                for (key, value) in env {
                    if key.is_empty() || key.contains(['=', '\0']) || value.contains('\0') {
                        return Err(format!(
                            "`env` has an invalid variable '{}' (names are non-empty without '=' or NUL)",
                            key.escape_debug()
                        ));
                    }
                }
            }
            McpTransport::Http { url, headers } => {
                let parsed =
                    reqwest::Url::parse(url).map_err(|error| format!("`url` '{url}' is not a URL: {error}"))?;
                if !matches!(parsed.scheme(), "http" | "https") {
                    return Err(format!("`url` '{url}' must start with http:// or https://"));
                }
                for (key, value) in headers {
                    let name = reqwest::header::HeaderName::from_bytes(key.as_bytes())
                        .map_err(|_| format!("`headers` has an invalid header name '{}'", key.escape_debug()))?;
                    if RESERVED_MCP_HEADERS.contains(&name.as_str()) {
                        return Err(format!("`headers` cannot set '{key}': the MCP transport sets it"));
                    }
                    if reqwest::header::HeaderValue::from_str(value).is_err() {
                        return Err(format!("`headers` has an invalid value for '{key}'"));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Checks that `name` can prefix tool names: 1 to [`MAX_MCP_SERVER_NAME`]
/// characters out of `A-Z a-z 0-9 _ -`.
pub fn check_mcp_server_name(name: &str) -> std::result::Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if name.is_empty() || name.len() > MAX_MCP_SERVER_NAME || !name.chars().all(allowed) {
        return Err(format!(
            "the server name '{}' must be 1 to {MAX_MCP_SERVER_NAME} characters out of A-Z a-z 0-9 _ - \
             (it prefixes the names of its tools)",
            name.escape_debug()
        ));
    }
    Ok(())
}

/// `[mcp]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMcpConfig {
    #[serde(default)]
    servers: BTreeMap<String, RawMcpServer>,
}

/// `[mcp.servers.NAME]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMcpServer {
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<PathBuf>,
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    timeout_secs: Option<u64>,
    startup_timeout_secs: Option<u64>,
    enabled: Option<bool>,
}

impl TryFrom<RawMcpConfig> for McpConfig {
    type Error = String;

    fn try_from(raw: RawMcpConfig) -> std::result::Result<Self, String> {
        let mut servers = BTreeMap::new();
        for (name, entry) in raw.servers {
            let server = mcp_server(&name, entry).map_err(|message| format!("[mcp.servers.{name}]: {message}"))?;
            servers.insert(name, server);
        }
        Ok(Self { servers })
    }
}

/// Builds and checks one server entry.
fn mcp_server(name: &str, raw: RawMcpServer) -> std::result::Result<McpServerConfig, String> {
    let stdio_only = !raw.args.is_empty() || !raw.env.is_empty() || raw.cwd.is_some();
    let transport = match (raw.command, raw.url) {
        (Some(_), Some(_)) => return Err("give either `command` or `url`, not both".to_owned()),
        (None, None) => return Err("give `command` (a child process) or `url` (streamable HTTP)".to_owned()),
        (Some(command), None) => {
            if !raw.headers.is_empty() {
                return Err("`headers` go with `url`, not `command`".to_owned());
            }
            McpTransport::Stdio {
                command,
                args: raw.args,
                env: raw.env,
                cwd: raw.cwd,
            }
        }
        (None, Some(url)) => {
            if stdio_only {
                return Err("`args`, `env` and `cwd` go with `command`, not `url`".to_owned());
            }
            McpTransport::Http {
                url,
                headers: raw.headers,
            }
        }
    };
    let seconds = |value: Option<u64>, default: Duration| value.map_or(default, Duration::from_secs);
    let server = McpServerConfig {
        transport,
        timeout: seconds(raw.timeout_secs, DEFAULT_MCP_CALL_TIMEOUT),
        startup_timeout: seconds(raw.startup_timeout_secs, DEFAULT_MCP_STARTUP_TIMEOUT),
        enabled: raw.enabled.unwrap_or(true),
    };
    server.check(name)?;
    Ok(server)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value).to_owned())
        }
    }

    fn error(result: Result<Arc<dyn Model>>) -> String {
        match result {
            Ok(model) => panic!("expected an error, got {}", model.name()),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn specs_pick_provider_endpoint_and_key() {
        let config = KeelConfig::default();
        let keys = env(&[("OPENAI_API_KEY", "sk-test"), ("ANTHROPIC_API_KEY", "sk-ant")]);
        for spec in [
            "openai:gpt-4.1-mini",
            "openai-responses:gpt-4.1-mini",
            "anthropic:claude-sonnet-4-5",
            "ollama:llama3.2",
        ] {
            let model = config
                .model_with_env(spec, &keys)
                .unwrap_or_else(|error| panic!("{spec}: {error}"));
            assert!(
                model
                    .name()
                    .contains(spec.split_once(':').map_or(spec, |(_, name)| name)),
                "{}",
                model.name()
            );
        }
        assert!(
            config.model_with_env("ollama:llama3.2", &env(&[])).is_ok(),
            "ollama needs no key"
        );
    }

    #[test]
    fn missing_keys_and_unknown_names_are_one_line_errors() {
        let config = KeelConfig::default();
        let missing = error(config.model_with_env("openai:gpt-4.1-mini", &env(&[])));
        assert_eq!(
            missing,
            "invalid configuration: model 'openai' needs an API key: set OPENAI_API_KEY"
        );
        assert!(error(config.model_with_env("anthropic:claude", &env(&[]))).contains("ANTHROPIC_API_KEY"));
        assert!(error(config.model_with_env("gemini:pro", &env(&[]))).contains("unknown model provider 'gemini'"));
        assert!(error(config.model_with_env("fast", &env(&[]))).contains("unknown model 'fast'"));
        assert!(error(config.model_with_env("openai:", &env(&[]))).contains("names no model"));
        assert!(!missing.contains('\n'));
    }

    #[test]
    fn a_custom_endpoint_needs_a_key_only_when_the_entry_names_one() {
        let config: KeelConfig = toml::from_str(
            r#"
            model = "local"
            [models.local]
            provider = "openai"
            model = "qwen"
            base_url = "http://127.0.0.1:8000/v1"

            [models.proxy]
            provider = "openai"
            model = "gpt"
            base_url = "http://127.0.0.1:4000"
            api_key_env = "PROXY_KEY"
            headers = { "X-Team" = "keel" }
            max_output_tokens = 1024
            temperature = 0.5
            "#,
        )
        .expect("config");
        assert_eq!(config.model.as_deref(), Some("local"));
        assert!(config.model_with_env("local", &env(&[])).is_ok());
        assert!(error(config.model_with_env("proxy", &env(&[]))).contains("set PROXY_KEY"));
        assert!(config.model_with_env("proxy", &env(&[("PROXY_KEY", "k")])).is_ok());
        // OPENAI_BASE_URL moves `openai:` specs to another endpoint, keyless.
        assert!(
            config
                .model_with_env("openai:m", &env(&[("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")]))
                .is_ok()
        );
    }

    #[test]
    fn unknown_fields_in_the_file_are_errors() {
        let bad = toml::from_str::<KeelConfig>("[models.x]\nprovider = \"openai\"\nmodel = \"m\"\nkey = \"sk\"\n");
        assert!(bad.is_err());
    }

    fn mcp(text: &str) -> std::result::Result<McpConfig, String> {
        toml::from_str::<KeelConfig>(text)
            .map(|config| config.mcp)
            .map_err(|error| error.message().to_owned())
    }

    #[test]
    fn mcp_servers_are_child_processes_or_urls_with_defaults() {
        let config = mcp(r#"
            [mcp.servers.files]
            command = "npx"
            args = ["-y", "@modelcontextprotocol/server-filesystem", "."]
            env = { LOG_LEVEL = "warn" }
            cwd = "sub"
            timeout_secs = 5

            [mcp.servers.remote-search]
            url = "https://mcp.example.com/mcp"
            headers = { Authorization = "Bearer secret-token" }
            startup_timeout_secs = 7
            enabled = false
            "#)
        .expect("config");
        let files = &config.servers["files"];
        assert_eq!(
            files.transport,
            McpTransport::Stdio {
                command: "npx".into(),
                args: vec![
                    "-y".into(),
                    "@modelcontextprotocol/server-filesystem".into(),
                    ".".into()
                ],
                env: BTreeMap::from([("LOG_LEVEL".into(), "warn".into())]),
                cwd: Some(PathBuf::from("sub")),
            }
        );
        assert_eq!(files.timeout, Duration::from_secs(5));
        assert_eq!(files.startup_timeout, DEFAULT_MCP_STARTUP_TIMEOUT);
        assert!(files.enabled);
        let search = &config.servers["remote-search"];
        assert!(matches!(&search.transport, McpTransport::Http { url, .. } if url == "https://mcp.example.com/mcp"));
        assert_eq!(search.timeout, DEFAULT_MCP_CALL_TIMEOUT);
        assert_eq!(search.startup_timeout, Duration::from_secs(7));
        assert!(!search.enabled);
        // Header and variable values may be secrets; Debug shows names only.
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("secret-token") && shown.contains("Authorization"),
            "{shown}"
        );
        assert!(mcp("").expect("no [mcp]").servers.is_empty());
    }

    #[test]
    fn bad_mcp_entries_are_one_line_errors_naming_the_server() {
        for (entry, expected) in [
            (
                "[mcp.servers.x]\ncommand = \"a\"\nurl = \"http://h/mcp\"",
                "[mcp.servers.x]: give either `command` or `url`, not both",
            ),
            (
                "[mcp.servers.x]\ntimeout_secs = 3",
                "[mcp.servers.x]: give `command` (a child process) or `url` (streamable HTTP)",
            ),
            (
                "[mcp.servers.\"my server\"]\ncommand = \"a\"",
                "the server name 'my server' must be 1 to 32 characters",
            ),
            ("[mcp.servers.a.b]\ncommand = \"a\"", "unknown field `b`"),
            (
                &format!("[mcp.servers.{}]\ncommand = \"a\"", "n".repeat(33)),
                "must be 1 to 32 characters",
            ),
            (
                "[mcp.servers.x]\ncommand = \" \"",
                "[mcp.servers.x]: `command` is empty",
            ),
            (
                "[mcp.servers.x]\ncommand = \"a\"\ntimeout_secs = 0",
                "timeouts must be at least 1 second",
            ),
            (
                "[mcp.servers.x]\ncommand = \"a\"\nheaders = { A = \"b\" }",
                "`headers` go with `url`",
            ),
            (
                "[mcp.servers.x]\nurl = \"http://h/mcp\"\nargs = [\"a\"]",
                "`args`, `env` and `cwd` go with `command`",
            ),
            ("[mcp.servers.x]\nurl = \"not a url\"", "`url` 'not a url' is not a URL"),
            (
                "[mcp.servers.x]\nurl = \"ftp://h/mcp\"",
                "must start with http:// or https://",
            ),
            (
                "[mcp.servers.x]\nurl = \"http://h/mcp\"\nheaders = { \"Mcp-Session-Id\" = \"1\" }",
                "cannot set 'Mcp-Session-Id'",
            ),
            (
                "[mcp.servers.x]\nurl = \"http://h/mcp\"\nheaders = { \"a b\" = \"1\" }",
                "invalid header name 'a b'",
            ),
            (
                "[mcp.servers.x]\ncommand = \"a\"\nenv = { \"A=B\" = \"1\" }",
                "`env` has an invalid variable 'A=B'",
            ),
            ("[mcp.servers.x]\ncommand = \"a\"\nkey = \"sk\"", "unknown field `key`"),
            ("[mcp]\nserver = {}", "unknown field `server`"),
        ] {
            let message = match mcp(entry) {
                Ok(config) => panic!("{entry}: accepted as {config:?}"),
                Err(message) => message,
            };
            assert!(message.contains(expected), "{entry}: {message}");
            assert!(!message.trim_end().contains('\n'), "{entry}: {message}");
        }
    }

    #[test]
    fn a_bad_mcp_entry_fails_loading_the_file() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("keel.toml");
        std::fs::write(&path, "[mcp.servers.x]\ncommand = \"a\"\nurl = \"http://h/mcp\"\n").expect("write");
        let message = KeelConfig::load(&path).expect_err("invalid").to_string();
        assert_eq!(
            message,
            format!(
                "invalid configuration: {}: [mcp.servers.x]: give either `command` or `url`, not both",
                path.display()
            )
        );
    }
}
