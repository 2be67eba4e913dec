//! The front door: which requests the server answers at all.
//!
//! A server on loopback without a token is reachable by every web page the
//! user opens, through the browser. Three checks, on every route (the UI,
//! the WebSocket upgrade and CORS preflights included), keep pages of other
//! sites out:
//!
//! - `Host` must name this server: the listen address, `localhost`,
//!   `127.0.0.1` or `[::1]` (any port), or a name the operator allowed;
//!   anything else, or none, is `421 misdirected_request`. This defeats DNS
//!   rebinding, where a page's own host name is re-pointed at 127.0.0.1.
//! - `Origin`, when sent, must be the server's own (its host and port equal
//!   to `Host`) or the configured CORS origin; anything else, `null`
//!   included, is `403 forbidden_origin`. Without an `Origin`, a
//!   `Sec-Fetch-Site` of `cross-site` or `same-site` is refused the same way,
//!   except for a top-level navigation (`GET` with `Sec-Fetch-Mode:
//!   navigate`), whose answer the other site cannot read.
//! - A declared `Content-Length` over the body limit is `413 too_large`,
//!   answered once the body is drained (up to four times the limit, ten
//!   seconds at most) so that a client writing it all first can read the
//!   answer; a larger one is answered at once.
//! - A request is well framed: exactly one `Host` (RFC 9112 §3.2: `400`
//!   for more), and no two `Content-Length`s that disagree (`400`).
//! - A body must arrive whole within the body timeout, counted from the end
//!   of the head: the door reads it (at most the body limit) before the
//!   handler runs, and answers `408 request_timeout` and closes the
//!   connection when it does not. A client cannot hold the body's buffer,
//!   or its connection, by sending all but the last byte.
//!
//! JSON bodies must also be `application/json` (see `extract::ApiJson`), so
//! no cross-site request can be a "simple" one that skips the preflight.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::Server;
use super::error::ApiError;

/// What the front door lets in.
#[derive(Debug)]
pub(crate) struct FrontDoor {
    /// Normalised host names (see [`normalise`]) answered on any port.
    hosts: HashSet<String>,
    cors_origin: Option<HeaderValue>,
    body_limit: usize,
    body_timeout: Duration,
}

/// The default time a request body gets to arrive whole once its head has.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// A name given to `--allow-host` that is not a host name.
#[derive(Debug, thiserror::Error)]
#[error("invalid allowed host '{0}': give a host name or an IP address, without a scheme, port or path")]
pub(crate) struct InvalidHost(pub(crate) String);

impl FrontDoor {
    /// The door of a server listening on `address`, answering also for
    /// `extra_hosts`, taking bodies of at most `body_limit` bytes that
    /// arrive within `body_timeout`.
    pub(crate) fn new(
        address: SocketAddr,
        extra_hosts: &[String],
        cors_origin: Option<HeaderValue>,
        body_limit: usize,
        body_timeout: Duration,
    ) -> Result<Self, InvalidHost> {
        let mut hosts: HashSet<String> = ["localhost", "127.0.0.1", "::1"]
            .into_iter()
            .map(str::to_owned)
            .collect();
        hosts.insert(address.ip().to_string());
        for name in extra_hosts {
            let trimmed = name.trim();
            // A bare IPv6 address is allowed too, not only a bracketed one.
            let host = if trimmed.parse::<IpAddr>().is_ok() {
                Some(trimmed)
            } else {
                host_of(trimmed).filter(|host| host.len() == trimmed.len())
            };
            match host {
                Some(host) if !host.is_empty() && !host.contains(['/', '@', '?', '#', ' ']) => {
                    hosts.insert(normalise(host));
                }
                _ => return Err(InvalidHost(name.clone())),
            }
        }
        Ok(Self {
            hosts,
            cors_origin,
            body_limit,
            body_timeout,
        })
    }

    /// Whether `authority` (`name[:port]`) names this server.
    fn answers_for(&self, authority: &str) -> bool {
        host_of(authority).is_some_and(|host| self.hosts.contains(&normalise(host)))
    }

    /// Why `request` is refused, if it is.
    fn refusal(&self, request: &Request) -> Option<ApiError> {
        let headers = request.headers();
        if let Some(malformed) = framing_error(headers) {
            return Some(malformed);
        }
        let host = headers.get(header::HOST).and_then(|value| value.to_str().ok());
        let Some(host) = host.filter(|host| self.answers_for(host)) else {
            return Some(ApiError::MisdirectedRequest(
                "this server does not answer for that Host".to_owned(),
            ));
        };
        // An absolute-form request target names a host too.
        if let Some(authority) = request.uri().authority()
            && !self.answers_for(authority.as_str())
        {
            return Some(ApiError::MisdirectedRequest(
                "this server does not answer for that host".to_owned(),
            ));
        }
        match headers.get(header::ORIGIN) {
            Some(origin) if !self.origin_allowed(origin, host) => {
                return Some(ApiError::ForbiddenOrigin(
                    "requests from that origin are not allowed".to_owned(),
                ));
            }
            Some(_) => {}
            None if cross_site_without_origin(request.method(), headers) => {
                return Some(ApiError::ForbiddenOrigin(
                    "cross-site requests are not allowed".to_owned(),
                ));
            }
            None => {}
        }
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok());
        if declared.is_some_and(|length| length > self.body_limit as u64) {
            return Some(ApiError::TooLarge(
                "the request body is over the server's limit".to_owned(),
            ));
        }
        None
    }

    /// Whether `origin` is this server's own (as reached through `host`,
    /// which passed the allow-list) or the configured CORS origin.
    fn origin_allowed(&self, origin: &HeaderValue, host: &str) -> bool {
        if self
            .cors_origin
            .as_ref()
            .is_some_and(|allowed| allowed.as_bytes().eq_ignore_ascii_case(origin.as_bytes()))
        {
            return true;
        }
        let Ok(origin) = origin.to_str() else {
            return false;
        };
        origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .is_some_and(|authority| authority.eq_ignore_ascii_case(host))
    }
}

/// Why a request's head is ambiguous, if it is: two `Host`s (which one
/// names the server is anybody's guess, and a proxy may have picked the
/// other), or `Content-Length`s that disagree (where the body ends is).
fn framing_error(headers: &HeaderMap) -> Option<ApiError> {
    if headers.get_all(header::HOST).iter().nth(1).is_some() {
        return Some(ApiError::InvalidRequest(
            "a request carries exactly one Host header".to_owned(),
        ));
    }
    let mut lengths = headers.get_all(header::CONTENT_LENGTH).iter();
    if let Some(first) = lengths.next()
        && lengths.any(|other| other.as_bytes().trim_ascii() != first.as_bytes().trim_ascii())
    {
        return Some(ApiError::InvalidRequest(
            "the request's Content-Length headers disagree".to_owned(),
        ));
    }
    None
}

/// A request a browser marked as coming from another site, other than a
/// top-level navigation.
fn cross_site_without_origin(method: &Method, headers: &HeaderMap) -> bool {
    let site = headers.get("sec-fetch-site").map(HeaderValue::as_bytes);
    let cross = matches!(site, Some(b"cross-site" | b"same-site"));
    let navigation = (method == Method::GET || method == Method::HEAD)
        && headers.get("sec-fetch-mode").map(HeaderValue::as_bytes) == Some(b"navigate");
    cross && !navigation
}

/// The host of an authority: `name`, `name:port`, `[v6]` or `[v6]:port`
/// give `name` or `v6`; `None` when it is malformed.
fn host_of(authority: &str) -> Option<&str> {
    let port_ok = |port: &str| port.bytes().all(|byte| byte.is_ascii_digit());
    if let Some(rest) = authority.strip_prefix('[') {
        let (address, after) = rest.split_once(']')?;
        let port_ok = after.is_empty() || after.strip_prefix(':').is_some_and(port_ok);
        return port_ok.then_some(address);
    }
    match authority.rsplit_once(':') {
        Some((name, port)) if port_ok(port) && !name.contains(':') => Some(name),
        Some(_) => None,
        None => Some(authority),
    }
}

/// One spelling per host: IP addresses in their canonical form, names in
/// lower case without a trailing dot.
fn normalise(host: &str) -> String {
    match host.parse::<IpAddr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => host.trim_end_matches('.').to_ascii_lowercase(),
    }
}

/// How much of a body over the limit is read and dropped before its `413`,
/// as a multiple of the limit: a client that sends the whole body before
/// reading the answer (most do) then gets to read it, instead of a broken
/// pipe as the server closes under its writes. Larger bodies are refused
/// at once.
const DRAIN_LIMITS: u64 = 4;

/// The longest a body over the limit is drained before its `413`.
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(10);

/// Middleware: answers the refusal of a request the door does not let in.
pub(crate) async fn admit(State(server): State<Arc<Server>>, request: Request, next: Next) -> Response {
    match server.front.refusal(&request) {
        Some(refusal) => {
            tracing::debug!(code = refusal.code(), "refused at the front door");
            // Counted under a route of its own: no route was matched, and
            // an operator wants to see pages knocking.
            server.metrics.http_request("refused", refusal.status().as_u16());
            if matches!(refusal, ApiError::TooLarge(_)) {
                drain(request, server.front.body_limit as u64 * DRAIN_LIMITS).await;
            }
            refusal.into_response()
        }
        None => match server.front.read_body(request).await {
            Ok(request) => next.run(request).await,
            Err(refusal) => {
                server.metrics.http_request("refused", refusal.status().as_u16());
                let mut response = refusal.into_response();
                // The rest of the body may still come: the connection
                // cannot be used again.
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                response
            }
        },
    }
}

impl FrontDoor {
    /// `request` with its body read whole, within the body timeout and the
    /// body limit; a request without a body is passed on as it is.
    async fn read_body(&self, request: Request) -> Result<Request, ApiError> {
        let headers = request.headers();
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok());
        let chunked = headers.contains_key(header::TRANSFER_ENCODING);
        if declared.is_none_or(|length| length == 0) && !chunked {
            return Ok(request);
        }
        let (parts, body) = request.into_parts();
        let limit = self.body_limit;
        let expected = declared.map_or(0, |length| usize::try_from(length).unwrap_or(limit).min(limit));
        let read = async move {
            let mut stream = body.into_data_stream();
            let mut bytes = Vec::with_capacity(expected);
            while let Some(chunk) = futures::StreamExt::next(&mut stream).await {
                let chunk =
                    chunk.map_err(|_| ApiError::InvalidRequest("the request body could not be read".to_owned()))?;
                if bytes.len() + chunk.len() > limit {
                    return Err(ApiError::TooLarge(
                        "the request body is over the server's limit".to_owned(),
                    ));
                }
                bytes.extend_from_slice(&chunk);
            }
            Ok(bytes)
        };
        match tokio::time::timeout(self.body_timeout, read).await {
            Ok(Ok(bytes)) => Ok(Request::from_parts(parts, Body::from(bytes))),
            Ok(Err(refusal)) => Err(refusal),
            Err(_) => {
                tracing::debug!(timeout = ?self.body_timeout, "a request body did not arrive in time");
                Err(ApiError::RequestTimeout(format!(
                    "the request body did not arrive within {} s",
                    self.body_timeout.as_secs_f64()
                )))
            }
        }
    }
}

/// Reads and drops the body of `request` if it declares at most `cap`
/// bytes, for at most [`DRAIN_TIME`].
async fn drain(request: Request, cap: u64) {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok());
    if declared.is_none_or(|length| length > cap) {
        return;
    }
    let mut body = request.into_body().into_data_stream();
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        while let Some(Ok(_)) = futures::StreamExt::next(&mut body).await {}
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn door(extra: &[&str]) -> FrontDoor {
        let extra: Vec<String> = extra.iter().map(|name| (*name).to_owned()).collect();
        FrontDoor::new(
            "127.0.0.1:7777".parse().expect("address"),
            &extra,
            Some(HeaderValue::from_static("https://app.example")),
            1024,
            DEFAULT_BODY_TIMEOUT,
        )
        .expect("door")
    }

    #[test]
    fn hosts_are_matched_by_name_on_any_port() {
        let door = door(&["Keel.Example", "::2"]);
        for host in [
            "127.0.0.1:7777",
            "127.0.0.1",
            "localhost:1",
            "LOCALHOST.",
            "[::1]:7777",
            "[0:0:0:0:0:0:0:1]",
            "keel.example:443",
            "[::2]",
        ] {
            assert!(door.answers_for(host), "{host}");
        }
        for host in [
            "rebind.example:7777",
            "127.0.0.2",
            "127.0.0.1:x",
            "::1",
            "[::1",
            "",
            "evil.localhost",
        ] {
            assert!(!door.answers_for(host), "{host}");
        }
        for bad in ["http://x", "x/y", "x:80", "", "a b"] {
            let given = vec![bad.to_owned()];
            assert!(
                FrontDoor::new(
                    "127.0.0.1:1".parse().expect("address"),
                    &given,
                    None,
                    1,
                    DEFAULT_BODY_TIMEOUT
                )
                .is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn only_the_own_origin_and_the_cors_origin_are_allowed() {
        let door = door(&[]);
        let allowed = |origin: &'static str| door.origin_allowed(&HeaderValue::from_static(origin), "127.0.0.1:7777");
        assert!(allowed("http://127.0.0.1:7777"));
        assert!(allowed("https://app.example"));
        assert!(!allowed("http://127.0.0.1:7778"));
        assert!(!allowed("http://evil.example"));
        assert!(!allowed("null"));
        assert!(!allowed("http://127.0.0.1:7777.evil.example"));
        assert!(!allowed("file://127.0.0.1:7777"));
    }
}
