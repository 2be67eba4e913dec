//! Keeping provider keys out of everything Keel stores or returns.
//!
//! Every [`Secret`](super::http::Secret) registers its value here when it is
//! made (values shorter than [`MIN_SECRET_LEN`] are too common to replace
//! safely and are skipped). [`redact`] replaces every registered value, and
//! any echoed credential header (`Authorization: Bearer …`, `x-api-key: …`,
//! `"api_key": "…"`) whatever its value, with `[redacted]`.
//!
//! It is applied where text that may echo a request leaves the provider or
//! the tools: provider error messages, the `error` and `warning` events the
//! agent records, tool outputs, and the API's error messages. Streamed
//! deltas are not scanned: they are the model's own text and the hot path.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::{LazyLock, Mutex};

use regex::Regex;

/// What a secret is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Shorter values are not registered: replacing them would mangle ordinary
/// text, and no real key is that short.
pub const MIN_SECRET_LEN: usize = 8;

/// The secret values of this process.
static SECRETS: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Credential headers and fields echoed in text, whatever their value: the
/// name, the separator and an optional scheme are kept, the value (8 or
/// more characters, not starting with `[`, so `[redacted]` stays as it is)
/// replaced.
static ECHOED: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(
        r#"(?i)((?:proxy-)?authorization|x-api-key|api[-_]?key|x-goog-api-key)(["']?\s*[:=]\s*["']?(?:(?:bearer|basic|token)\s+)?)[^\s"',;}\[\]]{8,}"#,
    )
    .ok()
});

/// A bare `Bearer <token>`, as in a header list printed without its name.
static BEARER: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{8,}").ok());

/// Remembers `value` as a secret, so [`redact`] replaces it from now on.
pub fn register(value: &str) {
    let value = value.trim();
    if value.len() < MIN_SECRET_LEN {
        return;
    }
    let mut secrets = SECRETS.lock().unwrap_or_else(|poison| poison.into_inner());
    if !secrets.contains(value) {
        secrets.insert(value.to_owned());
    }
}

/// `text` with every registered secret and every echoed credential header
/// replaced by `[redacted]`; borrowed when there was nothing to replace.
pub fn redact(text: &str) -> Cow<'_, str> {
    let mut text = Cow::Borrowed(text);
    {
        let secrets = SECRETS.lock().unwrap_or_else(|poison| poison.into_inner());
        // Longest first, so a secret containing another is replaced whole.
        let mut found: Vec<&String> = secrets.iter().filter(|secret| text.contains(secret.as_str())).collect();
        found.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
        for secret in found {
            text = Cow::Owned(text.replace(secret.as_str(), REDACTED));
        }
    }
    for (pattern, replacement) in [
        (&*ECHOED, format!("${{1}}${{2}}{REDACTED}")),
        (&*BEARER, format!("${{1}}{REDACTED}")),
    ] {
        let Some(pattern) = pattern else { continue };
        if let Cow::Owned(replaced) = pattern.replace_all(&text, replacement.as_str()) {
            text = Cow::Owned(replaced);
        }
    }
    text
}

/// [`redact`] into an owned string.
pub fn redact_owned(text: String) -> String {
    match redact(&text) {
        Cow::Borrowed(_) => text,
        Cow::Owned(redacted) => redacted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_secrets_and_echoed_headers_are_replaced() {
        register("sk-unit-test-secret-0123456789");
        register("short");
        let text = "upstream said: bad key sk-unit-test-secret-0123456789 (short)";
        assert_eq!(redact(text), "upstream said: bad key [redacted] (short)");
        for (echo, expected) in [
            (
                "Authorization: Bearer abcdefgh12345",
                "Authorization: Bearer [redacted]",
            ),
            (
                r#"{"headers": {"authorization": "Bearer abcdefgh12345"}}"#,
                r#"{"headers": {"authorization": "Bearer [redacted]"}}"#,
            ),
            ("x-api-key: abcdefgh12345", "x-api-key: [redacted]"),
            (r#""api_key": "zzzzzzzzzz""#, r#""api_key": "[redacted]""#),
            ("sent bearer abcdefgh12345 twice", "sent bearer [redacted] twice"),
        ] {
            assert_eq!(redact(echo), expected, "{echo}");
        }
    }

    #[test]
    fn clean_text_is_borrowed() {
        assert!(matches!(redact("nothing to see, Bearer of news"), Cow::Borrowed(_)));
        assert!(matches!(redact("Authorization: Bearer [redacted]"), Cow::Borrowed(_)));
    }
}
