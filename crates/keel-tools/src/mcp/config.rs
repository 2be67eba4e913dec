//! `[mcp]`: the MCP tool servers each session starts, checked as parsed.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

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
/// Parsing checks every entry, so a bad one fails `KeelConfig::load` with
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

    /// Registers the values of its `env` and `headers` with
    /// [`keel_secrets`]: they are how tokens reach MCP servers,
    /// and they are registered as the config is parsed, so that a tool's
    /// output echoing one is redacted even in a session that never starts
    /// this server.
    pub fn register_secrets(&self) {
        let values = match &self.transport {
            McpTransport::Stdio { env, .. } => env.values(),
            McpTransport::Http { headers, .. } => headers.values(),
        };
        values.for_each(|value| keel_secrets::register(value));
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
    server.register_secrets();
    Ok(server)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `[mcp]` table of a keel.toml.
    #[derive(Deserialize)]
    struct File {
        #[serde(default)]
        mcp: McpConfig,
    }

    fn mcp(text: &str) -> std::result::Result<McpConfig, String> {
        toml::from_str::<File>(text)
            .map(|file| file.mcp)
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
}
