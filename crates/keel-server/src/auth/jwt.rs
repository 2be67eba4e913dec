//! JWTs from the identity provider of `[auth.jwt]`.
//!
//! Verification is `jsonwebtoken`'s (RustCrypto backend). The checks, in
//! order: the header's `alg` is RS256, ES256 or EdDSA (`none` cannot even
//! be parsed, and HS* is refused, so a public key can never serve as an
//! HMAC secret); a key of the JWKS fits it (by `kid` when the token names
//! one; its type must match the algorithm, and its own `alg`, when set,
//! must be the token's); the signature verifies; `exp` is present and not
//! past, `nbf` (when present) is not ahead, both with `leeway_secs`; `iss`
//! and `aud` are present and the configured ones; the tenant claim is a
//! non-empty string (a tenant id). Anything else is refused.
//!
//! The key set is read at startup, every `refresh_secs`, and soon after a
//! token names a `kid` the set lacks (at most once per two seconds); a
//! failed read keeps the last good set.
//!
//! Verified tokens are cached by their SHA-256 until they expire (a bounded
//! map, emptied when full and whenever the key set changes), so a client
//! repeating its token costs a hash and a lookup, not a signature check.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use keel_config::JwtConfig;
use keel_protocol::ActorKind;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::principal::Principal;
use super::scope::{Scope, Scopes};
use super::{Liveness, Refused};

/// The most verified tokens remembered at once.
const CACHE_BOUND: usize = 4096;

/// How long a fetch of the JWKS URL may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// How soon a JWKS that could not be read at all is tried again; also the
/// least time between two reads asked for by tokens naming an unknown
/// `kid` (an identity provider that rotated its keys), so that made-up
/// `kid`s cannot make the server fetch without pause.
const RETRY_EMPTY: Duration = Duration::from_secs(2);

/// Why `[auth.jwt]` cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum JwtSetupError {
    /// The table itself is wrong.
    #[error("{0}")]
    Config(String),
    /// The JWKS file could not be read or holds no usable key.
    #[error("[auth.jwt] jwks_file {path}: {reason}")]
    Jwks {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// Where the keys come from.
#[derive(Debug, Clone)]
enum Source {
    File(PathBuf),
    Url(String),
}

/// One usable key of the JWKS.
struct Key {
    kid: Option<String>,
    alg: Algorithm,
    key: DecodingKey,
}

/// A verified token remembered until it expires.
struct Cached {
    principal: Principal,
    until_ms: u64,
}

/// The verifier of `[auth.jwt]`: its settings, the current key set and
/// the cache of verified tokens.
pub(crate) struct JwtVerifier {
    config: JwtConfig,
    source: Source,
    default_scopes: Scopes,
    keys: RwLock<Arc<Vec<Key>>>,
    cache: Mutex<HashMap<[u8; 32], Cached>>,
    client: reqwest::Client,
    /// Woken by a token whose `kid` is not in the set.
    unknown_kid: tokio::sync::Notify,
}

impl JwtVerifier {
    /// Checks `config` and reads the key set once: a file that cannot be
    /// read is an error; a URL that cannot be fetched yet is logged and
    /// retried by [`JwtVerifier::run`] (tokens are refused meanwhile).
    pub(crate) async fn new(config: JwtConfig) -> Result<Arc<Self>, JwtSetupError> {
        config.check().map_err(JwtSetupError::Config)?;
        let mut default_scopes = Vec::new();
        for name in &config.default_scopes {
            let scope = Scope::parse(name)
                .ok_or_else(|| JwtSetupError::Config(format!("[auth.jwt] default_scopes: unknown scope '{name}'")))?;
            default_scopes.push(scope);
        }
        let source = match (&config.jwks_file, &config.jwks_url) {
            (Some(path), _) => Source::File(path.clone()),
            (None, Some(url)) => Source::Url(url.clone()),
            (None, None) => return Err(JwtSetupError::Config("[auth.jwt] needs a key source".to_owned())),
        };
        // A redirect is refused, not followed: the operator named where the
        // keys are, and a redirect (from a compromised or misconfigured
        // identity provider, or whoever answers for its name) could send
        // the fetch anywhere, a private address included.
        let client = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|error| JwtSetupError::Config(format!("[auth.jwt] HTTP client: {error}")))?;
        let verifier = Arc::new(Self {
            config,
            source,
            default_scopes: Scopes::of(default_scopes),
            keys: RwLock::new(Arc::new(Vec::new())),
            cache: Mutex::new(HashMap::new()),
            client,
            unknown_kid: tokio::sync::Notify::new(),
        });
        match (verifier.refresh().await, &verifier.source) {
            (Ok(()), _) => {}
            (Err(reason), Source::File(path)) => {
                return Err(JwtSetupError::Jwks {
                    path: path.clone(),
                    reason,
                });
            }
            (Err(reason), Source::Url(url)) => {
                tracing::warn!(%url, %reason, "could not fetch the JWKS yet; JWTs are refused until it is");
            }
        }
        Ok(verifier)
    }

    /// Reads the key set again, keeping the last good one on failure.
    async fn refresh(&self) -> Result<(), String> {
        let text = match &self.source {
            Source::File(path) => tokio::fs::read_to_string(path)
                .await
                .map_err(|error| error.to_string())?,
            Source::Url(url) => self.fetch(url).await?,
        };
        let keys = parse_jwks(&text)?;
        let mut slot = self.keys.write().map_err(|_| "poisoned key set".to_owned())?;
        *slot = Arc::new(keys);
        drop(slot);
        // A key that left the set must stop vouching for cached tokens.
        if let Ok(mut cache) = self.cache.lock() {
            cache.clear();
        }
        Ok(())
    }

    async fn fetch(&self, url: &str) -> Result<String, String> {
        let response = self.client.get(url).send().await.map_err(|error| error.to_string())?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("the JWKS URL answered {status}"));
        }
        response.text().await.map_err(|error| error.to_string())
    }

    /// Reads the key set again every `refresh_secs` (sooner while none
    /// could be read, or when a token names a `kid` the set lacks, at most
    /// once per [`RETRY_EMPTY`]), logging failures.
    pub(crate) async fn run(self: Arc<Self>) {
        let every = Duration::from_secs(self.config.refresh_secs);
        let mut last = tokio::time::Instant::now();
        loop {
            let empty = self.keys.read().map(|keys| keys.is_empty()).unwrap_or(true);
            let wait = if empty { RETRY_EMPTY.min(every) } else { every };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.unknown_kid.notified() => tokio::time::sleep_until(last + RETRY_EMPTY).await,
            }
            last = tokio::time::Instant::now();
            if let Err(reason) = self.refresh().await {
                tracing::warn!(%reason, "could not refresh the JWKS; keeping the last good key set");
            }
        }
    }

    /// The principal of `token` when it is a valid JWT. A token that does
    /// not verify is [`Refused::Unknown`] (the reason is logged at debug
    /// level only); one that verifies but whose claims name no principal
    /// is refused with the reason, which its holder may read.
    ///
    /// The leeway lets a token whose `exp` just passed by the server's
    /// clock through the check (clocks disagree); what it opens (a stream)
    /// still lives only until `exp`.
    pub(crate) fn check(&self, token: &str, now_ms: u64) -> Result<(Principal, Liveness), Refused> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(hit) = self.cached(&digest, now_ms) {
            return Ok(hit);
        }
        let claims = self.verify(token).map_err(|reason| {
            tracing::debug!(%reason, "refused a JWT");
            Refused::Unknown
        })?;
        let (principal, exp_ms) = self.principal_of(&claims).map_err(|reason| {
            tracing::debug!(%reason, "refused a verified JWT");
            Refused::Because(reason)
        })?;
        let until_ms = exp_ms;
        if until_ms <= now_ms {
            // Within the leeway: let through, never cached.
            return Ok((principal, Liveness::Until(until_ms)));
        }
        if let Ok(mut cache) = self.cache.lock() {
            if cache.len() >= CACHE_BOUND {
                cache.retain(|_, cached| cached.until_ms > now_ms);
                if cache.len() >= CACHE_BOUND {
                    cache.clear();
                }
            }
            cache.insert(
                digest,
                Cached {
                    principal: principal.clone(),
                    until_ms,
                },
            );
        }
        Ok((principal, Liveness::Until(until_ms)))
    }

    fn cached(&self, digest: &[u8; 32], now_ms: u64) -> Option<(Principal, Liveness)> {
        let cache = self.cache.lock().ok()?;
        let cached = cache.get(digest)?;
        (cached.until_ms > now_ms).then(|| (cached.principal.clone(), Liveness::Until(cached.until_ms)))
    }

    /// Verifies `token` against the key set: its claims.
    fn verify(&self, token: &str) -> Result<HashMap<String, Value>, String> {
        let header = jsonwebtoken::decode_header(token).map_err(|error| format!("header: {error}"))?;
        if !matches!(header.alg, Algorithm::RS256 | Algorithm::ES256 | Algorithm::EdDSA) {
            return Err(format!("algorithm {:?} is not accepted", header.alg));
        }
        let keys = self
            .keys
            .read()
            .map(|keys| Arc::clone(&keys))
            .map_err(|_| "poisoned key set")?;
        if let Some(kid) = &header.kid
            && !keys.iter().any(|key| key.kid.as_ref() == Some(kid))
        {
            // Perhaps the provider rotated its keys: read them again soon.
            self.unknown_kid.notify_one();
        }
        let candidates = keys
            .iter()
            .filter(|key| key.alg == header.alg)
            .filter(|key| header.kid.is_none() || key.kid == header.kid);
        let mut validation = Validation::new(header.alg);
        validation.leeway = self.config.leeway_secs;
        validation.validate_nbf = true;
        validation.set_issuer(&[&self.config.issuer]);
        validation.set_audience(&[&self.config.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        let mut last = "no key of the JWKS fits the token".to_owned();
        for key in candidates {
            match jsonwebtoken::decode::<HashMap<String, Value>>(token, &key.key, &validation) {
                Ok(data) => return Ok(data.claims),
                Err(error) => last = error.to_string(),
            }
        }
        Err(last)
    }

    /// The principal a verified token's claims name.
    fn principal_of(&self, claims: &HashMap<String, Value>) -> Result<(Principal, u64), String> {
        let claim = &self.config.tenant_claim;
        let tenant = claims
            .get(claim)
            .and_then(Value::as_str)
            .ok_or_else(|| format!("the token has no `{claim}` claim naming its tenant"))?;
        if !keel_config::valid_tenant(tenant) {
            return Err(format!(
                "the token's `{claim}` claim is not a tenant name: {}",
                keel_config::TENANT_NAME_RULE
            ));
        }
        let subject = claims
            .get(&self.config.subject_claim)
            .and_then(Value::as_str)
            .filter(|subject| !subject.is_empty() && !subject.chars().any(char::is_control))
            .ok_or_else(|| {
                format!(
                    "the token has no valid `{}` claim naming its subject",
                    self.config.subject_claim
                )
            })?;
        let exp = claims
            .get("exp")
            .and_then(Value::as_u64)
            .ok_or("the token's `exp` is not a number of seconds")?;
        let scopes = match self.config.scopes_claim.as_ref().and_then(|claim| claims.get(claim)) {
            Some(Value::String(names)) => Scopes::of(names.split_whitespace().filter_map(Scope::parse)),
            Some(Value::Array(names)) => Scopes::of(names.iter().filter_map(Value::as_str).filter_map(Scope::parse)),
            Some(_) => return Err("the scopes claim is neither a string nor an array".to_owned()),
            None => self.default_scopes,
        };
        let principal = Principal::of_tenant(tenant, subject, ActorKind::Jwt, Some(subject.to_owned()), scopes);
        Ok((principal, exp.saturating_mul(1000)))
    }
}

/// The usable keys of a JWKS document: RSA (RS256), EC P-256 (ES256) and
/// Ed25519 (EdDSA) public keys; others (symmetric `oct` keys above all)
/// are skipped. An error when none is usable.
fn parse_jwks(text: &str) -> Result<Vec<Key>, String> {
    #[derive(serde::Deserialize)]
    struct Document {
        keys: Vec<Value>,
    }
    let document: Document = serde_json::from_str(text).map_err(|error| format!("not a JWKS: {error}"))?;
    let keys: Vec<Key> = document
        .keys
        .into_iter()
        .filter_map(|value| {
            let jwk: Jwk = serde_json::from_value(value)
                .map_err(|error| tracing::debug!(%error, "skipping a JWK that cannot be read"))
                .ok()?;
            usable(&jwk)
        })
        .collect();
    if keys.is_empty() {
        return Err("no RSA, P-256 or Ed25519 public key in the JWKS".to_owned());
    }
    Ok(keys)
}

fn usable(jwk: &Jwk) -> Option<Key> {
    let alg = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(params) if params.curve == EllipticCurve::P256 => Algorithm::ES256,
        AlgorithmParameters::OctetKeyPair(params) if params.curve == EllipticCurve::Ed25519 => Algorithm::EdDSA,
        _ => return None,
    };
    let declared = jwk.common.key_algorithm;
    let fits = match declared {
        None => true,
        Some(KeyAlgorithm::RS256) => alg == Algorithm::RS256,
        Some(KeyAlgorithm::ES256) => alg == Algorithm::ES256,
        Some(KeyAlgorithm::EdDSA) => alg == Algorithm::EdDSA,
        Some(_) => false,
    };
    if !fits {
        return None;
    }
    let key = DecodingKey::from_jwk(jwk).ok()?;
    Some(Key {
        kid: jwk.common.key_id.clone(),
        alg,
        key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symmetric_and_mismatched_keys_are_not_usable() {
        let oct = r#"{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}"#;
        assert!(parse_jwks(oct).is_err());
        let ed = r#"{"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}"#;
        let mismatched = format!(r#"{{"keys": [{}]}}"#, ed.replace('}', r#", "alg": "RS256"}"#));
        assert!(parse_jwks(&mismatched).is_err());
        let good = format!(r#"{{"keys": [{ed}, {{"kty": "oct", "k": "c2VjcmV0"}}]}}"#);
        let keys = parse_jwks(&good).expect("one usable key");
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].alg, Algorithm::EdDSA);
        assert!(parse_jwks("{}").is_err());
    }
}
