//! `keel config`: which config files were looked for and read, in order,
//! and the settings in effect, with every secret redacted (header values,
//! MCP servers' environment, API keys: only whether a key is set is shown).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use serde_json::{Value, json};

use crate::banner::policy_name;

/// Arguments of `keel config`.
#[derive(Args, Debug)]
pub(crate) struct ConfigArgs {
    /// The config file [default: $KEEL_CONFIG, ./keel.toml, or
    /// <config dir>/keel/keel.toml].
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// One place a config file is looked for.
pub(crate) struct Candidate {
    /// Where.
    pub(crate) path: PathBuf,
    /// Why there (`--config`, `$KEEL_CONFIG`, the current directory, the
    /// per-user config directory).
    pub(crate) origin: &'static str,
    /// `read`, `missing`, or `not looked at` (an earlier one was read).
    pub(crate) state: &'static str,
}

/// The places looked at, in the order `KeelConfig::discover` looks: an
/// explicit file or `$KEEL_CONFIG` ends the search (it must exist); else the
/// first existing of ./keel.toml and the per-user one is read.
pub(crate) fn candidates(explicit: Option<&std::path::Path>) -> Vec<Candidate> {
    let mut places: Vec<(PathBuf, &'static str, bool)> = Vec::new();
    if let Some(path) = explicit {
        places.push((path.to_path_buf(), "--config", true));
    } else if let Some(path) = std::env::var_os("KEEL_CONFIG") {
        places.push((PathBuf::from(path), "$KEEL_CONFIG", true));
    } else {
        places.push((PathBuf::from("keel.toml"), "the current directory", false));
        if let Some(dir) = dirs::config_dir() {
            places.push((
                dir.join("keel").join("keel.toml"),
                "the per-user config directory",
                false,
            ));
        }
    }
    let mut found = false;
    places
        .into_iter()
        .map(|(path, origin, only)| {
            let state = if found {
                "not looked at"
            } else if path.is_file() || only {
                found = true;
                "read"
            } else {
                "missing"
            };
            Candidate { path, origin, state }
        })
        .collect()
}

/// Runs `keel config`.
pub(crate) fn config(args: &ConfigArgs) -> anyhow::Result<ExitCode> {
    let (config, read) = keel::config::KeelConfig::discover(args.config.as_deref())?;
    let files: Vec<Value> = candidates(args.config.as_deref())
        .iter()
        .map(|candidate| json!({"path": candidate.path, "from": candidate.origin, "state": candidate.state}))
        .collect();
    let mut file = match &read {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            let value: toml::Value =
                toml::from_str(&text).with_context(|| format!("cannot parse {}", path.display()))?;
            serde_json::to_value(value).unwrap_or(Value::Null)
        }
        None => json!({}),
    };
    redact(&mut file, false);
    keel::secrets::redact_value(&mut file);
    let model = std::env::var("KEEL_MODEL").ok().filter(|model| !model.is_empty());
    let effective = json!({
        "model": model.clone().or(config.model.clone()),
        "model_from": if model.is_some() { "KEEL_MODEL" } else if config.model.is_some() { "keel.toml" } else { "none" },
        "models": config.models.keys().collect::<Vec<_>>(),
        "mcp_servers": config.mcp.servers.keys().collect::<Vec<_>>(),
        "tools": {"sandbox": policy_name(config.tools.sandbox), "network": config.tools.network, "shell": config.tools.shell},
        "server": {
            "max_sandbox": policy_name(config.server.max_sandbox),
            "auto_approve": config.server.auto_approve,
            "allow_network": config.server.allow_network,
            "script_dir": config.server.script_dir,
            "relay_wait_ms": config.server.relay_wait_ms,
            "sandbox_reads": config.server.sandbox_reads,
        },
        "api_keys": keel::provider::ProviderKind::key_variables()
            .into_iter()
            .map(|variable| (variable.to_owned(), json!(if std::env::var_os(variable).is_some() { "set" } else { "not set" })))
            .collect::<serde_json::Map<_, _>>(),
    });
    let report = json!({"files": files, "file": file, "effective": effective});
    if args.json {
        crate::print_line(&serde_json::to_string_pretty(&report)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    crate::print_line("config files, in the order they are looked for:")?;
    for candidate in candidates(args.config.as_deref()) {
        crate::print_line(&format!(
            "  {} ({}): {}",
            candidate.path.display(),
            candidate.origin,
            candidate.state
        ))?;
    }
    crate::print_line("effective settings (secrets redacted):")?;
    crate::print_line(&serde_json::to_string_pretty(&effective)?)?;
    if read.is_some() {
        crate::print_line("as written in the file (secrets redacted):")?;
        crate::print_line(&serde_json::to_string_pretty(&report["file"])?)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Replaces every value that may be a secret with `***`: all values under
/// `headers` and `env` tables, and any key naming a key, token, secret or
/// password.
fn redact(value: &mut Value, secret: bool) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map.iter_mut() {
                let lower = key.to_lowercase();
                let is_secret = secret
                    || matches!(lower.as_str(), "headers" | "env")
                    || ["password", "token", "secret", "authorization"]
                        .iter()
                        .any(|word| lower.contains(word))
                    || (lower.contains("key") && !lower.ends_with("_env"));
                redact(inner, is_secret);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| redact(item, secret)),
        other if secret => *other = Value::String("***".to_owned()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_env_values_and_keys_are_redacted_but_variable_names_kept() {
        let mut value = json!({
            "models": {"m": {"headers": {"X-Api": "hunter2"}, "api_key_env": "MY_KEY", "api_key": "sk-1"}},
            "mcp": {"servers": {"s": {"env": {"TOKEN": "abc"}, "command": "srv"}}},
        });
        redact(&mut value, false);
        let text = value.to_string();
        assert!(
            !text.contains("hunter2") && !text.contains("sk-1") && !text.contains("abc"),
            "{text}"
        );
        assert!(text.contains("MY_KEY") && text.contains("srv"), "{text}");
    }
}
