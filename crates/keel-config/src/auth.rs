//! `[auth]`: who may call `keel serve` besides the operator's token.
//!
//! API keys live in the store (`keel keys`); this table configures the
//! other source of principals, JWTs from an identity provider
//! (`[auth.jwt]`).

use std::path::PathBuf;

use serde::Deserialize;

/// `[auth]` in `keel.toml`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// JWTs from an identity provider (`[auth.jwt]`); none accepted
    /// without it.
    #[serde(default)]
    pub jwt: Option<JwtConfig>,
    /// Whether an API key or a JWT may name the tenant `default`, where
    /// the operator's own sessions are (those made with the token, or on
    /// an open loopback server). Off unless the operator says so: a token
    /// minted with that claim, or a key made for it, would otherwise act on
    /// the operator's sessions.
    #[serde(default)]
    pub allow_default_tenant: bool,
}

/// `[auth.jwt]`: how a bearer JWT becomes a principal. Only asymmetric
/// signatures (RS256, ES256, EdDSA) are accepted, from the keys of the
/// JWKS; `exp` is required, and `exp`, `nbf`, `iss` and `aud` are checked.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    /// The `iss` every token must carry.
    pub issuer: String,
    /// The `aud` every token must carry (one of its values when a list).
    pub audience: String,
    /// A JWKS file holding the identity provider's public keys (read at
    /// startup). Exactly one of `jwks_file` and `jwks_url`.
    #[serde(default)]
    pub jwks_file: Option<PathBuf>,
    /// A URL serving the JWKS, fetched at startup and every
    /// `refresh_secs` after; a failed fetch keeps the last good set.
    #[serde(default)]
    pub jwks_url: Option<String>,
    /// How often `jwks_url` is fetched again, in seconds.
    #[serde(default = "default_refresh_secs")]
    pub refresh_secs: u64,
    /// The claim naming the principal's tenant (a string); a token
    /// without it is refused.
    pub tenant_claim: String,
    /// The claim naming the principal (recorded as who did what).
    #[serde(default = "default_subject_claim")]
    pub subject_claim: String,
    /// The claim holding the scopes: a space-separated string (OAuth's
    /// `scope`) or an array of strings. Names that are not Keel's scopes
    /// are ignored. Without it (or when a token lacks it), `default_scopes`.
    #[serde(default)]
    pub scopes_claim: Option<String>,
    /// The scopes of a token whose scopes are not read from a claim.
    #[serde(default)]
    pub default_scopes: Vec<String>,
    /// Clock skew allowed on `exp` and `nbf`, in seconds.
    #[serde(default = "default_leeway_secs")]
    pub leeway_secs: u64,
}

/// The JWKS URL's refresh interval by default: five minutes.
pub const DEFAULT_JWKS_REFRESH_SECS: u64 = 300;

/// The leeway on `exp` and `nbf` by default.
pub const DEFAULT_JWT_LEEWAY_SECS: u64 = 30;

fn default_refresh_secs() -> u64 {
    DEFAULT_JWKS_REFRESH_SECS
}

fn default_subject_claim() -> String {
    "sub".to_owned()
}

fn default_leeway_secs() -> u64 {
    DEFAULT_JWT_LEEWAY_SECS
}

impl JwtConfig {
    /// Checks what can be checked without the keys: one key source, names
    /// that are not empty, a refresh interval and a leeway that make sense.
    pub fn check(&self) -> Result<(), String> {
        match (&self.jwks_file, &self.jwks_url) {
            (Some(_), Some(_)) => return Err("[auth.jwt] takes jwks_file or jwks_url, not both".to_owned()),
            (None, None) => return Err("[auth.jwt] needs jwks_file or jwks_url".to_owned()),
            (None, Some(url)) if !(url.starts_with("https://") || url.starts_with("http://")) => {
                return Err(format!("[auth.jwt] jwks_url '{url}' is not an http(s) URL"));
            }
            _ => {}
        }
        for (name, value) in [
            ("issuer", &self.issuer),
            ("audience", &self.audience),
            ("tenant_claim", &self.tenant_claim),
            ("subject_claim", &self.subject_claim),
        ] {
            if value.trim().is_empty() {
                return Err(format!("[auth.jwt] {name} must not be empty"));
            }
        }
        if self.refresh_secs == 0 {
            return Err("[auth.jwt] refresh_secs must be at least 1".to_owned());
        }
        if self.leeway_secs > 600 {
            return Err("[auth.jwt] leeway_secs must be at most 600".to_owned());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<AuthConfig, toml::de::Error> {
        toml::from_str(text)
    }

    #[test]
    fn the_jwt_table_has_defaults_and_needs_one_key_source() {
        let auth = parse(
            "[jwt]\nissuer = \"https://idp\"\naudience = \"keel\"\njwks_file = \"jwks.json\"\ntenant_claim = \"org\"\n",
        )
        .expect("parse");
        let jwt = auth.jwt.expect("jwt");
        assert_eq!(jwt.subject_claim, "sub");
        assert_eq!(jwt.leeway_secs, DEFAULT_JWT_LEEWAY_SECS);
        assert_eq!(jwt.refresh_secs, DEFAULT_JWKS_REFRESH_SECS);
        assert!(jwt.check().is_ok());

        let mut both = jwt.clone();
        both.jwks_url = Some("https://idp/jwks".to_owned());
        assert!(both.check().is_err());
        let mut neither = jwt.clone();
        neither.jwks_file = None;
        assert!(neither.check().is_err());
        let mut ftp = neither.clone();
        ftp.jwks_url = Some("ftp://idp/jwks".to_owned());
        assert!(ftp.check().is_err());
        let mut empty = jwt;
        empty.issuer = " ".to_owned();
        assert!(empty.check().is_err());
        assert!(
            parse("[jwt]\nissuer = \"x\"\n").is_err(),
            "audience and tenant_claim are required"
        );
        assert!(parse("[jwt]\nsecret = \"x\"\n").is_err(), "unknown keys are refused");
    }
}
