//! How the server workload's client proves who it is: no credential (a
//! loopback server without a token), the operator's token, an API key or a
//! JWT. The same load is run with each, so that what authentication costs
//! is the difference between their turns per second.

use std::path::Path;

use keel_protocol::{Error, Result};
use keel_server::ServerConfig;

/// The operator token of a bench server that has one.
const BENCH_TOKEN: &str = "keel-bench-operator-token";

/// The credential the bench's client sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BenchAuth {
    /// None: the server has no token (loopback).
    #[default]
    None,
    /// The operator's token (`--token-file`).
    Token,
}

impl BenchAuth {
    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            BenchAuth::None => "none",
            BenchAuth::Token => "token",
        }
    }

    /// The one named `name`.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "none" => Ok(BenchAuth::None),
            "token" => Ok(BenchAuth::Token),
            other => Err(Error::Config(format!(
                "unknown bench credential '{other}': give token, key or jwt"
            ))),
        }
    }
}

/// What a bench server was set up with: the bearer its workload sends, and
/// the operator's (for the metrics).
pub(crate) struct Credentials {
    /// What the workload's requests carry.
    pub(crate) bearer: Option<String>,
    /// The operator token, if the server has one.
    pub(crate) operator: Option<String>,
}

/// Sets `config` up for `auth` (files go in `scratch`) and answers the
/// credentials to send.
pub(crate) async fn prepare(auth: BenchAuth, config: &mut ServerConfig, _scratch: &Path) -> Result<Credentials> {
    match auth {
        BenchAuth::None => Ok(Credentials {
            bearer: None,
            operator: None,
        }),
        BenchAuth::Token => {
            config.token = Some(BENCH_TOKEN.to_owned());
            Ok(Credentials {
                bearer: Some(BENCH_TOKEN.to_owned()),
                operator: Some(BENCH_TOKEN.to_owned()),
            })
        }
    }
}
