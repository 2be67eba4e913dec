//! Where deliveries may go: an endpoint's URL is checked when it is
//! registered and again at every attempt, and the addresses its host
//! resolves to are checked by the client's own resolver, so that a name
//! that resolves to `127.0.0.1` (or is rebound to it later) is refused.
//! The client follows no redirect, uses no proxy and has a timeout.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use keel_config::WebhooksConfig;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use url::Url;

/// Why an endpoint's URL is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum TargetError {
    /// Not a URL.
    #[error("the endpoint's URL does not parse: {0}")]
    Malformed(String),
    /// A scheme other than `https` (or `http` where allowed).
    #[error("the endpoint's URL must be https{}", if *.0 { " or http" } else { " ([webhooks] allow_http is off)" })]
    Scheme(bool),
    /// Credentials in the URL (they would be sent to whoever answers).
    #[error("the endpoint's URL must not carry a user name or password")]
    Credentials,
    /// An address that is private, loopback, link-local or otherwise not
    /// public, and not in `[webhooks] allow_private`.
    #[error("the endpoint's address {0} is not public and not in [webhooks] allow_private")]
    Private(IpAddr),
}

/// Checks `url` against the settings without resolving it: the scheme,
/// no credentials, and an address written in it.
pub(crate) fn check_url(url: &str, settings: &WebhooksConfig) -> Result<Url, TargetError> {
    let parsed = Url::parse(url).map_err(|error| TargetError::Malformed(error.to_string()))?;
    match parsed.scheme() {
        "https" => {}
        "http" if settings.allow_http => {}
        _ => return Err(TargetError::Scheme(settings.allow_http)),
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(TargetError::Credentials);
    }
    match parsed.host() {
        Some(url::Host::Ipv4(v4)) if !settings.allows(IpAddr::V4(v4)) => Err(TargetError::Private(IpAddr::V4(v4))),
        Some(url::Host::Ipv6(v6)) if !settings.allows(IpAddr::V6(v6)) => Err(TargetError::Private(IpAddr::V6(v6))),
        Some(_) => Ok(parsed),
        None => Err(TargetError::Malformed("no host".to_owned())),
    }
}

/// Resolves with the system's resolver and keeps only the addresses the
/// settings allow; a name with none left fails to resolve.
struct CheckedResolver {
    settings: Arc<WebhooksConfig>,
}

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let settings = Arc::clone(&self.settings);
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let allowed: Vec<SocketAddr> = found
                .iter()
                .copied()
                .filter(|address| settings.allows(address.ip()))
                .collect();
            if allowed.is_empty() {
                let refused = found
                    .first()
                    .map_or_else(|| "no address".to_owned(), |address| address.ip().to_string());
                return Err(format!(
                    "{host} resolves to {refused}, which is not public and not in [webhooks] allow_private"
                )
                .into());
            }
            let addrs: Addrs = Box::new(allowed.into_iter());
            Ok(addrs)
        })
    }
}

/// The client deliveries are posted with.
pub(crate) fn client(settings: &Arc<WebhooksConfig>) -> reqwest::Client {
    let timeout = Duration::from_millis(settings.timeout_ms.max(1));
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .timeout(timeout)
        .connect_timeout(timeout)
        .user_agent(concat!("keel-webhooks/", env!("CARGO_PKG_VERSION")))
        .dns_resolver(Arc::new(CheckedResolver {
            settings: Arc::clone(settings),
        }))
        .build()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_for_scheme_credentials_and_literal_addresses() {
        let strict = WebhooksConfig::default();
        assert!(check_url("https://hooks.example.com/x", &strict).is_ok());
        assert_eq!(
            check_url("http://hooks.example.com/x", &strict),
            Err(TargetError::Scheme(false))
        );
        assert_eq!(
            check_url("ftp://hooks.example.com/x", &strict),
            Err(TargetError::Scheme(false))
        );
        assert_eq!(
            check_url("https://u:p@hooks.example.com/", &strict),
            Err(TargetError::Credentials)
        );
        for private in [
            "https://127.0.0.1/",
            "https://[::1]/",
            "https://169.254.169.254/latest/meta-data",
            "https://[::ffff:10.0.0.1]/",
            "https://2130706433/",
            "https://0x7f.1/",
        ] {
            assert!(
                matches!(check_url(private, &strict), Err(TargetError::Private(_))),
                "{private}"
            );
        }
        assert!(matches!(
            check_url("not a url", &strict),
            Err(TargetError::Malformed(_))
        ));
        let open = WebhooksConfig {
            allow_http: true,
            allow_private: vec!["127.0.0.0/8".parse().expect("net")],
            ..WebhooksConfig::default()
        };
        assert!(check_url("http://127.0.0.1:9/x", &open).is_ok());
        assert!(matches!(
            check_url("http://10.0.0.1/", &open),
            Err(TargetError::Private(_))
        ));
    }

    /// A name that resolves to loopback is refused by the resolver itself,
    /// whatever the URL looked like.
    #[tokio::test]
    async fn names_resolving_to_private_addresses_are_refused_at_connect() {
        let settings = Arc::new(WebhooksConfig::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let url = format!("https://localhost:{port}/hook");
        assert!(
            check_url(&url, &settings).is_ok(),
            "a name passes the check before resolution"
        );
        let sent = client(&settings).post(&url).body("{}").send().await;
        let error = sent.expect_err("refused");
        let mut text = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            text.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        assert!(text.contains("not public"), "{text}");
        // Nothing reached the listener.
        let accepted = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
        assert!(accepted.is_err(), "a connection was made");
    }
}
