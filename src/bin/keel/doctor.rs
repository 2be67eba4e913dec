//! `keel doctor`: checks what a Keel on this machine depends on, one line
//! each with ok, warn or fail and a hint: the shell's sandbox on this
//! kernel, the config file, the database (reachable, its schema version),
//! the models' providers (configured, their endpoint answering; keys are
//! never printed) and the MCP servers (each started and initialized). The
//! exit code is non-zero when a check fails.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use keel::config::KeelConfig;
use keel::provider::ProviderKind;
use keel::tools::workspace::SandboxPolicy;

use crate::banner::sandbox_support;
use crate::db::{DbArgs, Location};

/// Arguments of `keel doctor`.
#[derive(Args, Debug)]
pub(crate) struct DoctorArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The config file [default: $KEEL_CONFIG, ./keel.toml, or
    /// <config dir>/keel/keel.toml].
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Seconds each network check (a provider, the database, an MCP
    /// server) may take.
    #[arg(long, default_value_t = 5, value_name = "N")]
    timeout_secs: u64,
}

/// How a check came out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Ok,
    Warn,
    Fail,
}

/// The checks' lines, printed as they are made.
#[derive(Default)]
struct Report {
    failed: bool,
}

impl Report {
    fn line(&mut self, verdict: Verdict, what: &str, text: &str, hint: Option<&str>) -> anyhow::Result<()> {
        let label = match verdict {
            Verdict::Ok => "ok  ",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
        };
        self.failed |= verdict == Verdict::Fail;
        let text = keel::secrets::redact(text);
        let line = match hint {
            Some(hint) => format!("{label}  {what}: {text} (hint: {hint})"),
            None => format!("{label}  {what}: {text}"),
        };
        crate::print_line(&crate::terminal::terminal_safe(&line))
    }
}

/// Runs `keel doctor`.
pub(crate) async fn doctor(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let timeout = Duration::from_secs(args.timeout_secs.max(1));
    let mut report = Report::default();
    let (enforced, detail) = sandbox_support(SandboxPolicy::WorkspaceWrite);
    if enforced {
        report.line(
            Verdict::Ok,
            "sandbox",
            &format!("supported on this kernel ({detail})"),
            None,
        )?;
    } else {
        report.line(
            Verdict::Warn,
            "sandbox",
            &format!("not enforced on this kernel ({detail})"),
            Some("shell commands would run unconfined: use a kernel with Landlock (5.13+) or user namespaces"),
        )?;
    }
    let config = match KeelConfig::discover(args.config.as_deref()) {
        Ok((config, path)) => {
            let read = path.map_or("none found (defaults)".to_owned(), |path| path.display().to_string());
            report.line(Verdict::Ok, "config", &read, None)?;
            Some(config)
        }
        Err(error) => {
            report.line(
                Verdict::Fail,
                "config",
                &error.to_string(),
                Some("fix the file at the line named"),
            )?;
            None
        }
    };
    database(&mut report, &args.db, timeout).await?;
    if let Some(config) = &config {
        providers(&mut report, config, timeout).await?;
        mcp_servers(&mut report, config, timeout).await?;
    }
    Ok(if report.failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// The database: a SQLite file's schema version read without changing it;
/// a PostgreSQL database opened (which brings its schema up to date).
async fn database(report: &mut Report, db: &DbArgs, timeout: Duration) -> anyhow::Result<()> {
    let location = db.location()?;
    match &location {
        Location::Sqlite(path) if !path.exists() => report.line(
            Verdict::Warn,
            "database",
            &format!("{location} does not exist yet"),
            Some("keel serve creates it at the default path, or with --create"),
        ),
        Location::Sqlite(path) => {
            let supported = keel::store::sqlite::SCHEMA_VERSION;
            match keel::store::sqlite::stored_schema_version(path) {
                Ok(version) if version == supported => report.line(
                    Verdict::Ok,
                    "database",
                    &format!("{location}, schema version {version}"),
                    None,
                ),
                Ok(version) if version < supported => report.line(
                    Verdict::Warn,
                    "database",
                    &format!("{location}, schema version {version} (this keel writes {supported})"),
                    Some("it is upgraded when a keel command next opens it; back it up first (keel backup)"),
                ),
                Ok(version) => report.line(
                    Verdict::Fail,
                    "database",
                    &format!("{location}, schema version {version} is newer than this keel's {supported}"),
                    Some("run the keel that wrote it, or a newer one"),
                ),
                Err(error) => report.line(Verdict::Fail, "database", &format!("{location}: {error}"), None),
            }
        }
        Location::Postgres(_) => match tokio::time::timeout(timeout, db.open(false)).await {
            Ok(Ok(store)) => {
                store.close().await;
                report.line(
                    Verdict::Ok,
                    "database",
                    &format!("{location} reachable, schema up to date"),
                    None,
                )
            }
            Ok(Err(error)) => {
                let error = crate::db::explain_failure(&format!("{error:#}"), &location);
                report.line(Verdict::Fail, "database", &error.to_string(), None)
            }
            Err(_) => report.line(
                Verdict::Fail,
                "database",
                &format!("{location} did not answer within {} s", timeout.as_secs()),
                Some("check the host and port in --db"),
            ),
        },
    }
}

/// Each configured model (the default one and the named ones): built (a
/// missing key is a failure), and its provider's base URL asked for
/// anything at all: any HTTP answer means it is reachable.
async fn providers(report: &mut Report, config: &KeelConfig, timeout: Duration) -> anyhow::Result<()> {
    let mut specs: Vec<String> = config.model.iter().cloned().collect();
    specs.extend(
        config
            .models
            .keys()
            .filter(|name| config.model.as_ref() != Some(name))
            .cloned(),
    );
    if specs.is_empty() {
        return report.line(
            Verdict::Warn,
            "models",
            "no default model and none named in keel.toml",
            Some("set model = \"provider:name\" in keel.toml, or pass --model"),
        );
    }
    let client = reqwest::Client::builder().timeout(timeout).build()?;
    for spec in specs {
        let what = format!("model {spec}");
        if let Err(error) = config.model(&spec) {
            report.line(Verdict::Fail, &what, &error.to_string(), None)?;
            continue;
        }
        let Some(base_url) = base_url(config, &spec) else {
            report.line(Verdict::Ok, &what, "configured", None)?;
            continue;
        };
        match client.get(&base_url).send().await {
            Ok(response) => report.line(
                Verdict::Ok,
                &what,
                &format!("configured; {base_url} answers ({})", response.status()),
                None,
            )?,
            Err(error) => report.line(
                Verdict::Fail,
                &what,
                &format!("{base_url} cannot be reached: {}", root_cause(&error)),
                Some("check the base_url, the network, or that the local model server runs"),
            )?,
        }
    }
    Ok(())
}

/// The base URL a spec's provider is called at; `None` for a script.
fn base_url(config: &KeelConfig, spec: &str) -> Option<String> {
    let spec = spec.split_once('?').map_or(spec, |(base, _)| base);
    let (provider, custom) = match spec.split_once(':') {
        Some((provider, _)) => (provider.to_owned(), None),
        None => {
            let entry = config.models.get(spec)?;
            (entry.provider.clone(), entry.base_url.clone())
        }
    };
    let profile = provider.parse::<ProviderKind>().ok()?.profile();
    custom
        .or_else(|| profile.base_url_env.and_then(|name| std::env::var(name).ok()))
        .filter(|url| !url.is_empty())
        .or_else(|| Some(profile.base_url.to_owned()))
}

/// Every enabled MCP server, started and initialized as a session would.
async fn mcp_servers(report: &mut Report, config: &KeelConfig, timeout: Duration) -> anyhow::Result<()> {
    if config.mcp.servers.is_empty() {
        return Ok(());
    }
    let workspace = std::env::current_dir()?;
    let started = tokio::time::timeout(
        timeout * 4,
        keel::tools::mcp::start_servers(&config.mcp, &workspace, None),
    )
    .await;
    let Ok(servers) = started else {
        return report.line(Verdict::Fail, "mcp", "the servers did not start in time", None);
    };
    for server in servers.servers() {
        report.line(
            Verdict::Ok,
            &format!("mcp {}", server.name()),
            "started and initialized",
            None,
        )?;
    }
    for failure in servers.failures() {
        report.line(
            Verdict::Fail,
            "mcp",
            &failure.to_string(),
            Some("run its command by hand to see why"),
        )?;
    }
    Ok(())
}

/// The innermost cause of an error.
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}
