//! The `keel` command line: run sessions, chat in them, read their logs, run
//! benchmarks.
//!
//! Every command opens the SQLite database given by `--db` (or `KEEL_DB`, or
//! a file in the per-user data directory). Errors print as one line on
//! stderr with a non-zero exit code.

mod banner;
mod bench;
mod chaos;
mod chat;
mod cluster_key;
mod completions;
mod config_cmd;
mod console;
mod db;
mod doctor;
mod fork;
mod interrupts;
mod keys;
mod log;
mod run;
mod sandbox;
mod serve;
mod session;
mod terminal;
mod turn;
mod version;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "keel", version = version::LONG, about = "A durable agent runtime", propagate_version = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one turn per message in a session, streaming the answers.
    Run(run::RunArgs),
    /// Chat in a session on the terminal: one turn per line, answers streamed.
    Chat(chat::ChatArgs),
    /// Serve the HTTP API (sessions, submissions, event streams) and the web UI.
    Serve(serve::ServeArgs),
    /// Print a session's event log.
    Events(log::EventsArgs),
    /// List sessions, most recently active first.
    Sessions(log::SessionsArgs),
    /// Start a new session from another's history at a sequence.
    Fork(fork::ForkArgs),
    /// Make, list and revoke API keys (tenants' credentials with scopes).
    Keys(keys::KeysArgs),
    /// Copy the database, consistently, while a server may be using it.
    Backup(log::BackupArgs),
    /// Run a benchmark workload.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Run `keel serve` under load, break it at random, and check what
    /// clients were told against the store.
    Chaos(chaos::ChaosArgs),
    /// Print the shell's completion script for keel (bash, zsh, fish,
    /// powershell, elvish).
    Completions(completions::CompletionsArgs),
    /// Show which config files were read, in order, and the settings in
    /// effect (secrets redacted).
    Config(config_cmd::ConfigArgs),
    /// Check the sandbox, the config, the database, the models' providers
    /// and the MCP servers; non-zero exit when a check fails.
    Doctor(doctor::DoctorArgs),
    /// Print the HTTP API's OpenAPI 3.1 description (what `keel serve`
    /// serves at /v1/openapi.json), for client generators.
    Openapi,
    /// Run a command under a sandbox policy (the shell tool's launcher).
    #[command(hide = true)]
    SandboxExec(sandbox::SandboxExecArgs),
}

/// Which model to use, and where its configuration is.
#[derive(Args, Debug, Clone)]
struct ModelArgs {
    /// The model: provider:name (openai:, openai-responses:, anthropic:,
    /// ollama:, script:FILE) or a model named in keel.toml [default: the
    /// config's `model`].
    #[arg(long, env = "KEEL_MODEL", value_name = "SPEC")]
    model: Option<String>,
    /// The config file [default: $KEEL_CONFIG, ./keel.toml, or
    /// <config dir>/keel/keel.toml].
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
}

impl ModelArgs {
    /// Loads the configuration; the model is built from it with
    /// [`ModelArgs::build`] before any session work.
    fn config(&self) -> anyhow::Result<keel::config::KeelConfig> {
        let (config, path) = keel::config::KeelConfig::discover(self.config.as_deref())?;
        if let Some(path) = path {
            // It may hold headers with credentials (MCP servers, proxies).
            keel::tools::protected::protect(&path);
        }
        Ok(config)
    }

    /// Builds the model: `--model`, else the session's own (`stored`), else
    /// the config's. Returns it with its spec.
    fn build(
        &self,
        config: &keel::config::KeelConfig,
        stored: Option<&str>,
    ) -> anyhow::Result<(std::sync::Arc<dyn keel::Model>, String)> {
        let spec = self
            .model
            .clone()
            .or_else(|| stored.map(str::to_owned))
            .or_else(|| config.model.clone())
            .context(
                "no model: pass --model (for example --model openai:gpt-4.1-mini), set KEEL_MODEL, or set model in keel.toml",
            )?;
        let model = config.model(&spec)?;
        Ok((model, spec))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The launcher restricts its own thread before it starts the command:
    // it must run before tracing or the async runtime start any thread.
    let command = match cli.command {
        Command::SandboxExec(args) => return sandbox::sandbox_exec(args),
        command => command,
    };
    // No other process of this user (a sandboxed command that escaped its
    // namespaces, a debugger) may read this one's memory or environment,
    // where API keys live: a non-dumpable process's /proc files belong to
    // root and it cannot be traced. It also keeps keys out of core dumps.
    if let Err(error) = nix::sys::prctl::set_dumpable(false) {
        eprintln!("warning: cannot make this process non-dumpable: {error}");
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KEEL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: logs piped to a file or a collector
        // stay plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async {
        let outcome = match command {
            Command::Run(args) => run::run(args).await,
            Command::Chat(args) => chat::chat(args).await,
            Command::Serve(args) => serve::serve_command(args).await,
            Command::Events(args) => log::events(args).await,
            Command::Sessions(args) => log::sessions(args).await,
            Command::Fork(args) => fork::fork(args).await,
            Command::Keys(args) => keys::keys(args).await,
            Command::Backup(args) => log::backup(args).await,
            Command::Bench(command) => bench::bench(command).await,
            Command::Chaos(args) => chaos::chaos(args).await,
            Command::Completions(args) => completions::completions(&args),
            Command::Config(args) => config_cmd::config(&args),
            Command::Doctor(args) => doctor::doctor(args).await,
            Command::Openapi => {
                print!("{}", keel::server::openapi_json());
                Ok(ExitCode::SUCCESS)
            }
            Command::SandboxExec(_) => Err(anyhow::anyhow!("sandbox-exec runs before the async runtime starts")),
        };
        // The MCP servers' graceful stop runs on this runtime: once it is
        // dropped, what is left of them is killed outright.
        keel::tools::mcp::stop_all_servers(MCP_STOP_LIMIT).await;
        outcome
    });
    // A line editor still blocked on the terminal (a chat ended by a signal
    // at its prompt) must not keep the process from exiting.
    runtime.shutdown_timeout(RUNTIME_STOP_LIMIT);
    match outcome {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {}", terminal::terminal_safe(&format!("{error:#}")));
            ExitCode::FAILURE
        }
    }
}

/// How long the MCP servers get, together, to stop when a command ends
/// (each: two seconds after its stdin closed, two after `SIGTERM`).
const MCP_STOP_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long blocking work left at the end of a command may hold the exit.
const RUNTIME_STOP_LIMIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Writes a line to stdout; a closed pipe (`keel events | head`) is not an error.
fn print_line(line: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{line}") {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}
