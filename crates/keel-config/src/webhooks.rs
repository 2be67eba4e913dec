//! `[webhooks]`: where `keel serve` may post deliveries, how long it
//! retries, and the operator's own endpoints.
//!
//! The defaults are safe against a request turned on the operator's own
//! network: `https` only, and no private, loopback or link-local address
//! (after DNS resolution) unless `allow_private` names its network.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::Deserialize;

/// `[webhooks]` in `keel.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhooksConfig {
    /// Whether endpoints may be plain `http://` (a receiver on the
    /// operator's own network, a test); `https` only by default.
    #[serde(default)]
    pub allow_http: bool,
    /// Networks (CIDR, e.g. `10.1.0.0/16`, `127.0.0.1/32`) deliveries may
    /// go to although they are private, loopback or link-local.
    #[serde(default)]
    pub allow_private: Vec<IpNet>,
    /// How long one attempt may take, connecting included (ms).
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// How long a delivery is retried after its event before it is marked
    /// failed (seconds); a day by default.
    #[serde(default = "default_retry_for_s")]
    pub retry_for_s: u64,
    /// The first retry's delay (ms); each next one doubles, up to
    /// `max_backoff_ms`, less a random part (jitter).
    #[serde(default = "default_first_backoff_ms")]
    pub first_backoff_ms: u64,
    /// The longest delay between two attempts (ms).
    #[serde(default = "default_max_backoff_ms")]
    pub max_backoff_ms: u64,
    /// The most deliveries in flight at once on one node.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// How many days delivered and failed deliveries stay listed.
    #[serde(default = "default_keep_days")]
    pub keep_days: u64,
    /// The operator's endpoints, by id (`[webhooks.endpoints.<id>]`),
    /// stored at start: an endpoint of that id made over the API is
    /// replaced.
    #[serde(default)]
    pub endpoints: BTreeMap<String, WebhookEndpointConfig>,
}

impl Default for WebhooksConfig {
    fn default() -> Self {
        Self {
            allow_http: false,
            allow_private: Vec::new(),
            timeout_ms: default_timeout_ms(),
            retry_for_s: default_retry_for_s(),
            first_backoff_ms: default_first_backoff_ms(),
            max_backoff_ms: default_max_backoff_ms(),
            max_in_flight: default_max_in_flight(),
            keep_days: default_keep_days(),
            endpoints: BTreeMap::new(),
        }
    }
}

impl WebhooksConfig {
    /// Whether a delivery may go to `address`: any public address, and a
    /// private, loopback, link-local or otherwise special one only when
    /// `allow_private` names its network.
    pub fn allows(&self, address: IpAddr) -> bool {
        let address = canonical(address);
        is_public(address) || self.allow_private.iter().any(|network| network.contains(&address))
    }
}

/// `[webhooks.endpoints.<id>]`: an endpoint the operator configures.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookEndpointConfig {
    /// Where deliveries are posted.
    pub url: String,
    /// The environment variable that holds the signing secret (`whsec_`
    /// and base64, as the receiver's Standard Webhooks library takes it).
    pub secret_env: String,
    /// A second variable, for a secret being rotated out: deliveries are
    /// signed with both while it is set.
    #[serde(default)]
    pub previous_secret_env: Option<String>,
    /// The event types it receives.
    pub event_types: Vec<String>,
    /// Only the sessions of this bot.
    #[serde(default)]
    pub bot: Option<String>,
    /// Only the sessions of this tenant.
    #[serde(default)]
    pub tenant: Option<String>,
}

fn default_timeout_ms() -> u64 {
    10_000
}

fn default_retry_for_s() -> u64 {
    86_400
}

fn default_first_backoff_ms() -> u64 {
    1_000
}

fn default_max_backoff_ms() -> u64 {
    600_000
}

fn default_max_in_flight() -> usize {
    32
}

fn default_keep_days() -> u64 {
    7
}

/// An IPv4 address written as IPv6 (`::ffff:127.0.0.1`) as the IPv4 one,
/// so that it is judged as what it reaches.
fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, IpAddr::V4),
        IpAddr::V4(_) => address,
    }
}

/// Whether `address` is on the public internet: not loopback, private,
/// link-local, shared (CGNAT), unspecified, broadcast, multicast,
/// documentation, benchmarking or reserved space. For IPv6 only global
/// unicast (`2000::/3`) is, and within it not the ranges that embed,
/// translate or tunnel IPv4 addresses (6to4, Teredo and the rest of
/// `2001::/23`) nor documentation: so the IPv4-translated
/// (`::ffff:0:0/96`), NAT64 (`64:ff9b::/96`, `64:ff9b:1::/48`),
/// IPv4-compatible, unique-local, link-local and discard-only ranges, and
/// whatever is assigned outside `2000::/3` later, are refused as a class.
fn is_public(address: IpAddr) -> bool {
    match address {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            !(v4.is_unspecified()
                || v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
                || (a == 192 && b == 0 && c == 0)
                || (a == 198 && (b == 18 || b == 19))
                || a >= 240)
        }
        IpAddr::V6(v6) => {
            let segments = v6.segments();
            let global_unicast = (segments[0] & 0xe000) == 0x2000;
            global_unicast
                && !(segments[0] == 0x2002
                    || (segments[0] == 0x2001 && segments[1] < 0x0200)
                    || (segments[0] == 0x2001 && segments[1] == 0x0db8)
                    || (segments[0] == 0x3fff && segments[1] < 0x1000))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_addresses_are_allowed_unless_their_network_is_listed() {
        let config = WebhooksConfig::default();
        for refused in [
            "127.0.0.1",
            "127.8.9.10",
            "10.0.0.1",
            "172.16.5.4",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "2002:7f00:1::1",
            "64:ff9b::a9fe:a9fe",
            "2001::1",
            // IPv4-translated (`::ffff:0:0/96`), the rest of NAT64 and
            // discard-only: no global unicast address embeds them.
            "::ffff:0:127.0.0.1",
            "::ffff:0:7f00:1",
            "::ffff:0:a9fe:a9fe",
            "64:ff9b:1::7f00:1",
            "100::1",
            "2001:2::1",
            "2001:10::1",
            "2001:db8::1",
            "3fff::1",
            "4000::1",
            "ff02::1",
        ] {
            let address: IpAddr = refused.parse().expect("address");
            assert!(!config.allows(address), "{refused} is allowed");
        }
        for allowed in [
            "93.184.216.34",
            "8.8.8.8",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "2a00:1450:4001::200e",
            "2001:4860:4860::8888",
        ] {
            let address: IpAddr = allowed.parse().expect("address");
            assert!(config.allows(address), "{allowed} is refused");
        }
        let listed = WebhooksConfig {
            allow_private: vec!["127.0.0.1/32".parse().expect("net"), "fd00::/8".parse().expect("net")],
            ..WebhooksConfig::default()
        };
        assert!(listed.allows("127.0.0.1".parse().expect("address")));
        assert!(listed.allows("::ffff:127.0.0.1".parse().expect("address")));
        assert!(listed.allows("fd12::1".parse().expect("address")));
        assert!(!listed.allows("127.0.0.2".parse().expect("address")));
        assert!(!listed.allows("10.0.0.1".parse().expect("address")));
    }
}
