//! Authentication: how a request becomes a [`Principal`].
//!
//! Every `/v1/…` request (but the description) and `/metrics` carries
//! `Authorization: Bearer <credential>`; the event stream and the
//! WebSocket also accept `?access_token=<credential>`, since browsers
//! cannot set headers there. The credential is, tried in this order:
//!
//! 1. the operator's token (`--token-file`), compared in constant time:
//!    the operator, every scope on every tenant;
//! 2. an API key (`keel_<id>_<secret>`, see [`keys`]): its tenant and
//!    scopes, checked against every node's in-memory copy of the keys;
//! 3. a JWT of `[auth.jwt]` (see [`jwt`]): the tenant, subject and scopes
//!    its claims name.
//!
//! Anything else is `401 unauthorized`, the same answer whichever part
//! failed (the reason is logged at debug level), except for a credential
//! that verified but names what no credential may: a JWT whose tenant claim
//! is not a tenant name, or a key or JWT of the operator's tenant
//! (`default`) without `[auth] allow_default_tenant`; that `401` says why.
//! Credentials are never logged or echoed. `/metrics` needs `admin` on every tenant (a key or a
//! JWT of one tenant is `403 missing_scope_admin` there): its numbers are
//! the whole server's.
//!
//! **No credentials at all.** A server on loopback without a token has
//! always treated every request as the operator's (it is the operator's
//! own machine). That stays so only while nothing else can authenticate:
//! once `[auth.jwt]` is configured or the store holds any API key (revoked
//! and expired ones included, so revoking every key does not silently
//! reopen the server), a request without a valid credential is `401`, on
//! loopback too. Keys handed out mean the server has principals of
//! limited reach, and an anonymous request must not outrank them; the
//! operator then uses a token or the CLI, which opens the database itself.
//! A server off loopback needs a token in any case.
//!
//! Each authenticated request also carries a [`Liveness`]: streams opened
//! with a key end when it is revoked or expires, and those opened with a
//! JWT when it expires.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::Server;
use crate::error::ApiError;
pub(crate) use keel_protocol::now_ms;

pub(crate) mod jwt;
pub(crate) mod keys;
mod principal;
pub(crate) mod scope;

pub(crate) use principal::Principal;
pub use scope::Scope;
pub(crate) use scope::Scopes;

/// The server's bearer token. Its `Debug` does not show it.
#[derive(Clone)]
pub(crate) struct Token(Arc<str>);

impl Token {
    pub(crate) fn new(token: &str) -> Self {
        Self(Arc::from(token))
    }

    /// Whether `given` is the token, in time independent of where they differ.
    fn matches(&self, given: &str) -> bool {
        bool::from(self.0.as_bytes().ct_eq(given.as_bytes()))
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(…)")
    }
}

/// The sources of principals a server was configured with.
pub(crate) struct Authenticator {
    /// The operator's token.
    pub(crate) token: Option<Token>,
    /// The API keys, when the store keeps them.
    pub(crate) keys: Option<Arc<keys::KeyTable>>,
    /// `[auth.jwt]`'s verifier.
    pub(crate) jwt: Option<Arc<jwt::JwtVerifier>>,
    /// Whether keys and JWTs may act for the operator's tenant (`[auth]
    /// allow_default_tenant`).
    pub(crate) allow_default_tenant: bool,
}

/// Why a credential gave no principal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Not a credential of this server (unknown, wrong, expired, badly
    /// signed): nothing more is said.
    Unknown,
    /// A credential this server verified, naming what no credential may;
    /// said to its holder.
    Because(String),
}

impl From<Refused> for ApiError {
    fn from(refused: Refused) -> Self {
        match refused {
            Refused::Unknown => Self::Unauthorized,
            Refused::Because(reason) => Self::CredentialRefused(reason),
        }
    }
}

impl Authenticator {
    /// Whether a request without credentials is the operator's: no token,
    /// no JWTs, and no API key ever made (see the module's text).
    fn open(&self) -> bool {
        self.token.is_none() && self.jwt.is_none() && !self.keys.as_ref().is_some_and(|keys| keys.any())
    }

    /// The principal `credential` stands for, or why none.
    fn principal_of(&self, credential: &str, now_ms: u64) -> Result<(Principal, Liveness), Refused> {
        if self.token.as_ref().is_some_and(|token| token.matches(credential)) {
            return Ok((Principal::operator(), Liveness::Forever));
        }
        let found = if keys::looks_like_key(credential) {
            self.keys
                .as_ref()
                .and_then(|keys| keys.check(credential, now_ms))
                .ok_or(Refused::Unknown)
        } else {
            match &self.jwt {
                Some(jwt) => jwt.check(credential, now_ms),
                None => {
                    tracing::debug!("refused a credential: neither the token nor a key, and no JWTs are configured");
                    Err(Refused::Unknown)
                }
            }
        }?;
        if found.0.tenant_filter() == Some(keel_protocol::DEFAULT_TENANT) && !self.allow_default_tenant {
            return Err(Refused::Because(DEFAULT_TENANT_REFUSED.to_owned()));
        }
        Ok(found)
    }
}

/// Why a key or JWT of the operator's tenant is refused.
pub(crate) const DEFAULT_TENANT_REFUSED: &str = "this credential names the tenant `default`, where the operator's own \
     sessions are; no key or token acts for it unless keel.toml says `[auth] allow_default_tenant = true`";

/// Until when a request's credential works, for what outlives the request
/// (event streams, WebSockets): put in each authenticated request's
/// extensions beside its [`Principal`].
#[derive(Clone)]
pub(crate) enum Liveness {
    /// The operator's token (or no token on loopback): for as long as the
    /// server runs.
    Forever,
    /// An API key: until it is revoked (on any node) or expires.
    Key {
        /// The keys, which know when it is revoked.
        table: Arc<keys::KeyTable>,
        /// The key's id.
        id: String,
    },
    /// A JWT: until its `exp`, in ms since the epoch (the leeway is for
    /// clocks that disagree at the check, not a longer life).
    Until(u64),
}

impl Liveness {
    /// Resolves when the credential stops working.
    pub(crate) async fn ended(self) {
        match self {
            Self::Forever => std::future::pending().await,
            Self::Key { table, id } => table.ended(&id).await,
            Self::Until(at_ms) => tokio::time::sleep(Duration::from_millis(at_ms.saturating_sub(now_ms()))).await,
        }
    }
}

/// Middleware: puts the request's [`Principal`] and [`Liveness`] in its
/// extensions, or answers `401 unauthorized`.
pub(crate) async fn authenticate(State(server): State<Arc<Server>>, mut request: Request, next: Next) -> Response {
    let auth = &server.auth;
    if auth.open() {
        request.extensions_mut().insert(Principal::operator());
        request.extensions_mut().insert(Liveness::Forever);
        return next.run(request).await;
    }
    let now = now_ms();
    let from_header = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(|given| auth.principal_of(given.trim(), now));
    let found = match from_header {
        Some(Ok(found)) => Ok(found),
        from_header => {
            let route = request.extensions().get::<MatchedPath>().map(MatchedPath::as_str);
            let from_query = route
                .filter(|route| accepts_query_token(route))
                .and_then(|_| query_token(&request))
                .map(|given| auth.principal_of(&given, now));
            match from_query {
                Some(Ok(found)) => Ok(found),
                // The header's reason first when both were refused.
                from_query => Err(from_header
                    .and_then(Result::err)
                    .or_else(|| from_query.and_then(Result::err))
                    .unwrap_or(Refused::Unknown)),
            }
        }
    };
    match found {
        Ok((principal, liveness)) => {
            request.extensions_mut().insert(principal);
            request.extensions_mut().insert(liveness);
            next.run(request).await
        }
        Err(refused) => ApiError::from(refused).into_response(),
    }
}

/// The routes a browser opens without being able to set headers, by their
/// pattern: a raw path such as `/v1/sessions/ws` (the session `ws`) must
/// not pass for one.
fn accepts_query_token(route: &str) -> bool {
    matches!(route, "/v1/sessions/{id}/events/stream" | "/v1/sessions/{id}/ws")
}

fn query_token(request: &Request) -> Option<String> {
    axum::extract::Query::<HashMap<String, String>>::try_from_uri(request.uri())
        .ok()
        .and_then(|axum::extract::Query(mut query)| query.remove("access_token"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_match_only_exactly_and_are_not_shown() {
        let token = Token::new("s3cret");
        assert!(token.matches("s3cret"));
        assert!(!token.matches("s3cre"));
        assert!(!token.matches("s3cret!"));
        assert!(!token.matches(""));
        assert_eq!(format!("{token:?}"), "Token(…)");
    }

    #[test]
    fn without_any_source_everyone_is_the_operator_and_with_a_token_only_its_holder() {
        let open = Authenticator {
            token: None,
            keys: None,
            jwt: None,
            allow_default_tenant: false,
        };
        assert!(open.open());
        let closed = Authenticator {
            token: Some(Token::new("t0ken")),
            keys: None,
            jwt: None,
            allow_default_tenant: false,
        };
        assert!(!closed.open());
        let (principal, _) = closed.principal_of("t0ken", 0).expect("the operator");
        assert_eq!(principal, Principal::operator());
        assert_eq!(closed.principal_of("keel_0123_abc", 0).err(), Some(Refused::Unknown));
        assert_eq!(
            closed.principal_of("eyJhbGciOiJub25lIn0.e30.", 0).err(),
            Some(Refused::Unknown)
        );
    }
}
