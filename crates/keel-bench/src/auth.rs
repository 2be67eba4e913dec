//! How the server workload's client proves who it is: no credential (a
//! loopback server without a token), the operator's token, an API key or a
//! JWT. The same load is run with each, so that what authentication costs
//! is the difference between their turns per second.
//!
//! The JWT is signed with a fixed Ed25519 key pair that exists for the
//! bench alone (its public half is written to a JWKS file the server reads
//! through `[auth.jwt]`); no deployment trusts it.

use std::path::Path;
use std::sync::Arc;

use keel_protocol::{Error, Result, now_ms};
use keel_server::{Scope, ServerConfig, new_api_key};
use keel_store::AccessStore;
use serde_json::json;

/// The operator token of a bench server that has one.
const BENCH_TOKEN: &str = "keel-bench-operator-token";

/// The tenant, key name and JWT subject of the bench's principal.
const BENCH_TENANT: &str = "bench";

/// The bench-only Ed25519 private key (PKCS#8, DER) the JWT is signed
/// with.
const BENCH_JWT_PRIVATE_DER: [u8; 48] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20, 0xa0, 0xde, 0xfd,
    0xde, 0x3f, 0x0a, 0x72, 0x41, 0xab, 0x02, 0x66, 0x73, 0x4f, 0xb2, 0x90, 0x0b, 0x89, 0x3b, 0xfa, 0xa3, 0x4b, 0x7e,
    0x21, 0x07, 0x8f, 0xb7, 0x4b, 0x12, 0xe7, 0x23, 0xc4, 0x5e,
];

/// Its public key, base64url (the JWK's `x`).
const BENCH_JWT_PUBLIC_X: &str = "p_OktYkyH7_KPdC0oyrKMG4Qn9Z9l9GpqBwUEH8oIdQ";

/// The issuer and audience of the bench's JWTs.
const BENCH_ISSUER: &str = "https://keel-bench.invalid/";
const BENCH_AUDIENCE: &str = "keel-bench";

/// The credential the bench's client sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BenchAuth {
    /// None: the server has no token (loopback).
    #[default]
    None,
    /// The operator's token (`--token-file`).
    Token,
    /// An API key of the bench's tenant with `read` and `submit`, made in
    /// the store before the server starts.
    Key,
    /// A JWT of the bench's tenant (EdDSA), checked against a JWKS file.
    Jwt,
}

impl BenchAuth {
    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            BenchAuth::None => "none",
            BenchAuth::Token => "token",
            BenchAuth::Key => "key",
            BenchAuth::Jwt => "jwt",
        }
    }

    /// The one named `name`.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "none" => Ok(BenchAuth::None),
            "token" => Ok(BenchAuth::Token),
            "key" => Ok(BenchAuth::Key),
            "jwt" => Ok(BenchAuth::Jwt),
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
    /// The tenant the workload's sessions belong to.
    pub(crate) tenant: &'static str,
}

/// Sets `config` up for `auth` (keys go in `access`, files in `scratch`)
/// and answers the credentials to send.
pub(crate) async fn prepare(
    auth: BenchAuth,
    config: &mut ServerConfig,
    access: Arc<dyn AccessStore>,
    scratch: &Path,
) -> Result<Credentials> {
    let bearer = match auth {
        BenchAuth::None => {
            return Ok(Credentials {
                bearer: None,
                operator: None,
                tenant: keel_protocol::DEFAULT_TENANT,
            });
        }
        BenchAuth::Token => BENCH_TOKEN.to_owned(),
        BenchAuth::Key => {
            let created = new_api_key(
                BENCH_TENANT,
                BENCH_TENANT,
                &[Scope::Read, Scope::Submit],
                None,
                now_ms(),
            )
            .map_err(|error| Error::Config(format!("cannot make the bench's API key: {error}")))?;
            access.create_api_key(&created.record).await?;
            created.key
        }
        BenchAuth::Jwt => {
            config.keel.auth.jwt = Some(jwt_config(scratch)?);
            signed_jwt()?
        }
    };
    config.token = Some(BENCH_TOKEN.to_owned());
    config.access = Some(access);
    // The operator's sessions are the default tenant's, the others the
    // bench tenant's.
    let tenant = match auth {
        BenchAuth::Token => keel_protocol::DEFAULT_TENANT,
        _ => BENCH_TENANT,
    };
    Ok(Credentials {
        bearer: Some(bearer),
        operator: Some(BENCH_TOKEN.to_owned()),
        tenant,
    })
}

/// `[auth.jwt]` trusting the bench's key, from a JWKS file it writes in
/// `scratch`.
fn jwt_config(scratch: &Path) -> Result<keel_config::JwtConfig> {
    let jwks = json!({"keys": [{
        "kty": "OKP", "crv": "Ed25519", "x": BENCH_JWT_PUBLIC_X, "kid": "bench", "alg": "EdDSA", "use": "sig",
    }]});
    let path = scratch.join("bench-jwks.json");
    std::fs::write(&path, jwks.to_string())
        .map_err(|error| Error::Config(format!("cannot write the bench's JWKS: {error}")))?;
    serde_json::from_value(json!({
        "issuer": BENCH_ISSUER,
        "audience": BENCH_AUDIENCE,
        "jwks_file": path,
        "tenant_claim": "tenant",
        "scopes_claim": "scope",
    }))
    .map_err(|error| Error::Config(format!("the bench's [auth.jwt] does not parse: {error}")))
}

/// A JWT of the bench's tenant with `read` and `submit`, valid for a day.
fn signed_jwt() -> Result<String> {
    let now = now_ms() / 1000;
    let claims = json!({
        "iss": BENCH_ISSUER, "aud": BENCH_AUDIENCE, "sub": BENCH_TENANT, "tenant": BENCH_TENANT,
        "scope": "read submit", "iat": now, "nbf": now, "exp": now + 86_400,
    });
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
    header.kid = Some("bench".to_owned());
    let key = jsonwebtoken::EncodingKey::from_ed_der(&BENCH_JWT_PRIVATE_DER);
    jsonwebtoken::encode(&header, &claims, &key)
        .map_err(|error| Error::Config(format!("cannot sign the bench's JWT: {error}")))
}
