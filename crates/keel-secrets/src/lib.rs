//! Keeping secrets (provider keys, configured headers, the server's token)
//! out of everything Keel stores or returns.
//!
//! Every provider key registers its value here when it is made, and so does
//! the configuration as it is loaded (every `[models]` header, every MCP `env`
//! and `headers` value, the API keys it names) and `keel serve` for its token.
//! Values shorter than [`MIN_SECRET_LEN`] are too common to replace safely and
//! are skipped; a value with whitespace also registers each of its words that
//! long (the token of `Bearer …`).
//!
//! [`redact`] replaces every registered value, as it is or base64-encoded,
//! whitespace inside it ignored, and any echoed credential header
//! (`Authorization: Bearer …`, `x-api-key: …`, `"api_key": "…"`) whatever its
//! value, and every credential recognisable by its shape whatever its value
//! (Keel's own API keys, `keel_<16 hex>_<43 base64url>`, and JWTs), with
//! `[redacted]`. [`StreamRedactor`] does the same for text that
//! arrives in pieces, holding back a piece's end that could begin a secret
//! until the next piece shows whether it does.
//!
//! The recorder applies it to everything a session commits; providers, the
//! configuration and the API apply it to their error messages. It must not
//! know any other Keel crate (it depends on none), which is what lets them all
//! redact without naming each other.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::{Arc, LazyLock, Mutex, RwLock};

use regex::Regex;

mod forms;

use self::forms::{Matcher, Span};

/// What a secret is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Shorter values are not registered: replacing them would mangle ordinary
/// text, and no real key is that short.
pub const MIN_SECRET_LEN: usize = 8;

/// The secret values of this process.
static SECRETS: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Every form of every secret, compiled into one automaton; rebuilt when a
/// new secret is registered (rare), read by every redaction (often).
static MATCHER: RwLock<Option<Arc<Matcher>>> = RwLock::new(None);

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

/// Credentials known by their shape, whatever their value and wherever
/// they stand (pasted into a conversation, printed by a command): Keel's
/// own API keys and JWTs (three base64url parts, the first two JSON
/// objects, so each starts `eyJ`). Another server's keys are not
/// registered here, so their shape is what gives them away.
static SHAPED: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r"keel_[0-9a-f]{16}_[A-Za-z0-9_-]{43}|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*").ok()
});

/// The end of a streamed piece that may begin a [`SHAPED`] credential, held
/// back until the next piece shows whether it does: a word that starts
/// there and is a beginning of `keel_…` or `eyJ…` (so `the` is released at
/// once, and ` ke` waits for one more piece).
static SHAPED_TAIL: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r"(?:^|[^A-Za-z0-9_-])(k|ke|kee|keel(?:_[A-Za-z0-9_-]{0,60})?|e|ey|eyJ[A-Za-z0-9_.-]{0,4096})$").ok()
});

/// Words without which none of [`ECHOED`], [`BEARER`] and [`SHAPED`] can
/// match: the regexes run only on text that has one (one fast scan instead
/// of three).
///
/// A regex rather than a case-insensitive automaton: its literal prefilter
/// scans text that has none of the words about thirty times faster (every
/// stored event and streamed delta passes here), and it folds case as the
/// two regexes do.
static CREDENTIAL_WORDS: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(?i)authorization|api[-_]?key|bearer|(?-i:keel_|eyJ)").ok());

/// Remembers `value` as a secret, so [`redact`] replaces it from now on,
/// and each of its whitespace-separated words at least [`MIN_SECRET_LEN`]
/// long (the token of `Bearer <token>` is a secret on its own).
pub fn register(value: &str) {
    let value = value.trim();
    let mut secrets = SECRETS.lock().unwrap_or_else(|poison| poison.into_inner());
    let mut added = false;
    for candidate in std::iter::once(value).chain(value.split_whitespace()) {
        if candidate.len() >= MIN_SECRET_LEN && !secrets.contains(candidate) {
            secrets.insert(candidate.to_owned());
            added = true;
        }
    }
    if added {
        let forms = secrets.iter().flat_map(|secret| forms::forms_of(secret)).collect();
        let matcher = Matcher::new(forms).map(Arc::new);
        // Replaced while the registry is locked, so two registrations
        // cannot install their automatons out of order.
        *MATCHER.write().unwrap_or_else(|poison| poison.into_inner()) = matcher;
    }
}

/// The automaton of the secrets registered so far, if any are.
fn matcher() -> Option<Arc<Matcher>> {
    MATCHER.read().unwrap_or_else(|poison| poison.into_inner()).clone()
}

/// `text` with every registered secret and every echoed credential header
/// replaced by `[redacted]`; borrowed when there was nothing to replace.
pub fn redact(text: &str) -> Cow<'_, str> {
    let spans = matcher()
        .map(|matcher| matcher.spans(text.as_bytes()))
        .unwrap_or_default();
    let text = replace_spans(text, &spans);
    match redact_echoed(&text) {
        Cow::Borrowed(_) => text,
        Cow::Owned(replaced) => Cow::Owned(replaced),
    }
}

/// [`redact`] into an owned string.
pub fn redact_owned(text: String) -> String {
    match redact(&text) {
        Cow::Borrowed(_) => text,
        Cow::Owned(redacted) => redacted,
    }
}

/// Redacts `text` in place; whether anything was replaced.
pub fn redact_in_place(text: &mut String) -> bool {
    match redact(text) {
        Cow::Borrowed(_) => false,
        Cow::Owned(redacted) => {
            *text = redacted;
            true
        }
    }
}

/// Redacts every string of `value` (keys stay as they are); whether
/// anything was replaced.
pub fn redact_value(value: &mut serde_json::Value) -> bool {
    match value {
        serde_json::Value::String(text) => redact_in_place(text),
        serde_json::Value::Array(items) => items
            .iter_mut()
            .fold(false, |changed, item| redact_value(item) | changed),
        serde_json::Value::Object(fields) => fields
            .values_mut()
            .fold(false, |changed, field| redact_value(field) | changed),
        _ => false,
    }
}

/// Whether serialized JSON may hold something [`redact`] replaces in one of
/// its strings: a quick look before the strings themselves are redacted.
/// It may say yes where they hold nothing (then nothing changes), never no
/// where they hold a registered secret or an echoed credential.
pub fn json_may_need_redaction(json: &str) -> bool {
    matcher().is_some_and(|matcher| matcher.is_match_json(json.as_bytes()))
        || CREDENTIAL_WORDS.as_ref().is_some_and(|words| words.is_match(json))
}

/// `text` with `spans` (byte ranges on character boundaries, in order)
/// replaced by [`REDACTED`].
fn replace_spans<'a>(text: &'a str, spans: &[Span]) -> Cow<'a, str> {
    if spans.is_empty() {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for span in spans {
        // A form is ASCII, so its span is on character boundaries; a span
        // that were not would be widened to them.
        let start = floor_boundary(text, span.start.max(at));
        let end = ceil_boundary(text, span.end);
        out.push_str(&text[at..start]);
        out.push_str(REDACTED);
        at = end;
    }
    out.push_str(&text[at..]);
    Cow::Owned(out)
}

fn floor_boundary(text: &str, mut index: usize) -> usize {
    while index > 0 && !text.is_char_boundary(index) {
        index -= 1;
    }
    index
}

fn ceil_boundary(text: &str, mut index: usize) -> usize {
    while index < text.len() && !text.is_char_boundary(index) {
        index += 1;
    }
    index
}

/// `text` with echoed credential headers replaced.
fn redact_echoed(text: &str) -> Cow<'_, str> {
    if !CREDENTIAL_WORDS.as_ref().is_none_or(|words| words.is_match(text)) {
        return Cow::Borrowed(text);
    }
    let mut text = Cow::Borrowed(text);
    for (pattern, replacement) in [
        (&*ECHOED, format!("${{1}}${{2}}{REDACTED}")),
        (&*BEARER, format!("${{1}}{REDACTED}")),
        (&*SHAPED, REDACTED.to_owned()),
    ] {
        let Some(pattern) = pattern else { continue };
        if let Cow::Owned(replaced) = pattern.replace_all(&text, replacement.as_str()) {
            text = Cow::Owned(replaced);
        }
    }
    text
}

/// Redacts text that arrives in pieces (a model's streamed deltas), so that
/// a secret split across pieces is replaced too: the end of a piece that
/// could begin a secret is held back until the next piece (or
/// [`Self::finish`]) shows whether it does.
#[derive(Debug, Default)]
pub struct StreamRedactor {
    held: String,
    /// The last character released: whether a piece's first word starts
    /// there or goes on from the piece before.
    released_last: Option<char>,
}

/// Whether `c` can be part of a word of a [`SHAPED`] credential.
fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

impl StreamRedactor {
    /// The redacted text that can be released once `piece` arrived; may be
    /// empty when all of it is held back.
    pub fn push(&mut self, piece: &str) -> String {
        let mut text = std::mem::take(&mut self.held);
        text.push_str(piece);
        let goes_on = self.released_last.is_some_and(is_word_char);
        let shaped_tail = SHAPED_TAIL
            .as_ref()
            .and_then(|tail| tail.captures(&text))
            .and_then(|found| found.get(1))
            // A word that began in a piece released before is no credential's start.
            .filter(|found| found.start() > 0 || !goes_on)
            .map_or(text.len(), |found| found.start());
        let Some(matcher) = matcher() else {
            self.held = text.split_off(shaped_tail);
            self.note_released(&text);
            return redact_owned(text);
        };
        let spans = matcher.spans(text.as_bytes());
        let after_last_match = spans.last().map_or(0, |span| span.end);
        let release = matcher
            .pending_start(text.as_bytes(), after_last_match)
            .map_or(text.len(), |start| floor_boundary(&text, start))
            .min(shaped_tail);
        self.held = text.split_off(release);
        self.note_released(&text);
        match replace_spans(&text, &spans) {
            Cow::Borrowed(_) => redact_echoed(&text).into_owned(),
            Cow::Owned(replaced) => redact_echoed(&replaced).into_owned(),
        }
    }

    /// The text held back, redacted: the stream ended (or the next text is
    /// not part of it).
    pub fn finish(&mut self) -> String {
        self.released_last = None;
        redact_owned(std::mem::take(&mut self.held))
    }

    /// Remembers the end of `released` (unless it is empty).
    fn note_released(&mut self, released: &str) {
        if let Some(last) = released.chars().next_back() {
            self.released_last = Some(last);
        }
    }

    /// Whether text is held back.
    pub fn is_holding(&self) -> bool {
        !self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_credential_words_are_found_in_any_case_and_nothing_else_is() {
        for text in ["AUTHORIZATION", "x-Api-Key: …", "api_KEY", "\"apikey\":", "sent BeArEr"] {
            assert!(json_may_need_redaction(text), "{text}");
        }
        for text in ["the quick brown fox", "a pikey", "bear er", "authorisation", ""] {
            assert!(
                !CREDENTIAL_WORDS.as_ref().is_some_and(|words| words.is_match(text)),
                "{text}"
            );
        }
    }

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
    fn a_secret_split_across_streamed_pieces_is_replaced_and_nothing_else_is_held() {
        register("sk-stream-unit-0123456789");
        let mut stream = StreamRedactor::default();
        let released: Vec<String> = ["Here: sk-str", "eam-unit-01", "23456789 and ", "more sk-s"]
            .into_iter()
            .map(|piece| stream.push(piece))
            .collect();
        assert_eq!(released, ["Here: ", "", "[redacted] and ", "more "]);
        assert!(stream.is_holding());
        assert_eq!(stream.finish(), "sk-s");
        assert_eq!(
            StreamRedactor::default().push("plain text, ends in s"),
            "plain text, ends in s"
        );
    }

    #[test]
    fn every_string_of_a_json_value_is_redacted_and_json_is_looked_at_first() {
        register("sk-json-unit-0123456789");
        let mut value = serde_json::json!({"a": ["x", {"b": "key sk-json-unit-0123456789"}], "n": 1});
        assert!(redact_value(&mut value));
        assert_eq!(value, serde_json::json!({"a": ["x", {"b": "key [redacted]"}], "n": 1}));
        assert!(json_may_need_redaction(r#"{"t":"sk-json-unit-01234\n56789"}"#));
        assert!(json_may_need_redaction(r#"{"t":"Authorization: x"}"#));
        assert!(!json_may_need_redaction(r#"{"t":"nothing here"}"#));
    }

    #[test]
    fn keel_keys_and_jwts_are_replaced_by_their_shape_streamed_or_whole() {
        let key = "keel_0123456789abcdef_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_abcde";
        let jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlLXNpZ25hdHVyZQ";
        assert_eq!(redact(&format!("my key is {key}.")), "my key is [redacted].");
        assert_eq!(redact(&format!("token={jwt} done")), "token=[redacted] done");
        assert!(json_may_need_redaction(&format!("{{\"t\":\"{key}\"}}")));
        // Neither the words nor a key's look-alikes.
        for clean in ["the keel_serve binary", "keel_0123_abc", "eyJ alone", "Keel keeps logs"] {
            assert!(matches!(redact(clean), Cow::Borrowed(_)), "{clean}");
        }
        for (text, size) in [format!("key {key} ok"), format!("jwt {jwt} ok")]
            .into_iter()
            .flat_map(|text| (1..=12).map(move |size| (text.clone(), size)))
        {
            let mut stream = StreamRedactor::default();
            let mut out: String = text
                .as_bytes()
                .chunks(size)
                .map(|piece| stream.push(std::str::from_utf8(piece).expect("ascii")))
                .collect();
            out.push_str(&stream.finish());
            assert!(
                out.contains(REDACTED) && !out.contains("AbCdEf") && !out.contains("c2lnbmF0"),
                "in pieces of {size}: {out}"
            );
            assert!(out.ends_with(" ok"), "{out}");
        }
    }

    #[test]
    fn a_word_going_on_from_the_piece_before_is_not_held_back() {
        let mut stream = StreamRedactor::default();
        let released: Vec<String> = ["d", "e", "k", " ke", "ttle", " e"]
            .into_iter()
            .map(|piece| stream.push(piece))
            .collect();
        assert_eq!(released, ["d", "e", "k", " ", "kettle", " "]);
        assert_eq!(stream.finish(), "e");
    }

    #[test]
    fn clean_text_is_borrowed() {
        assert!(matches!(redact("nothing to see, Bearer of news"), Cow::Borrowed(_)));
        assert!(matches!(redact("Authorization: Bearer [redacted]"), Cow::Borrowed(_)));
    }
}
