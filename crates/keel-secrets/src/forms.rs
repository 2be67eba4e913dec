//! The forms a secret takes in text, and one automaton that finds them all.
//!
//! A secret is looked for as it is, and as its base64 (standard and
//! URL-safe alphabets, at each of the three byte offsets a secret can have
//! inside the encoded data; the characters that depend on the bytes around
//! it, and the padding, are left out, so padded and unpadded encodings are
//! both found). Whitespace is ignored on both sides, so a secret split by
//! spaces or newlines (or a base64 wrapped at 76 columns) is found too.
//!
//! Every form also contributes its tails from the second, third and fourth
//! byte on while they stay [`MIN_SECRET_LEN`] long: text streamed in pieces
//! holds back only a piece's end of four or more bytes that could begin a
//! form (see [`Matcher::pending_start`]), so a form whose first piece ended
//! after one to three of its bytes is found by its tail in the next piece.

use std::collections::BTreeSet;

use aho_corasick::automaton::Automaton;
use aho_corasick::dfa::DFA;
use aho_corasick::{Anchored, MatchKind};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};

use super::MIN_SECRET_LEN;

/// The shortest end of a streamed piece that is held back because it could
/// begin a form; shorter beginnings are caught by the forms' tails.
pub(super) const MIN_HELD_BYTES: usize = 4;

/// Whitespace ignored inside a secret: ASCII space, tab, newline, carriage
/// return, form feed.
fn is_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r' | 0x0c)
}

/// `text` without whitespace.
fn squeezed(text: &[u8]) -> Vec<u8> {
    text.iter().copied().filter(|byte| !is_space(*byte)).collect()
}

/// The base64 characters of `secret` that do not depend on the bytes before
/// or after it, when it starts `offset` (0, 1 or 2) bytes into a 3-byte group.
fn base64_core(engine: &impl Engine, secret: &[u8], offset: usize) -> String {
    let mut data = vec![0u8; offset];
    data.extend_from_slice(secret);
    let encoded = engine.encode(&data);
    // Character `i` holds bits 6i..6i+6: the first one wholly past the
    // `offset` bytes before, the last one wholly inside the secret.
    let first = (8 * offset).div_ceil(6);
    let end = 8 * (offset + secret.len()) / 6;
    encoded.get(first..end).unwrap_or_default().to_owned()
}

/// Every form of `secret` looked for, whitespace removed.
pub(super) fn forms_of(secret: &str) -> Vec<Vec<u8>> {
    let raw = squeezed(secret.as_bytes());
    let mut forms = vec![raw.clone()];
    for offset in 0..3 {
        for core in [
            base64_core(&STANDARD_NO_PAD, &raw, offset),
            base64_core(&URL_SAFE_NO_PAD, &raw, offset),
        ] {
            if core.len() >= MIN_SECRET_LEN {
                forms.push(core.into_bytes());
            }
        }
    }
    let tails: Vec<Vec<u8>> = forms
        .iter()
        .flat_map(|form| {
            (1..MIN_HELD_BYTES)
                .filter_map(move |skip| form.get(skip..))
                .filter(|tail| tail.len() >= MIN_SECRET_LEN)
                .map(<[u8]>::to_vec)
        })
        .collect();
    forms.extend(tails);
    forms
}

/// The registered forms, compiled once per change of the registry.
pub(super) struct Matcher {
    dfa: DFA,
    /// The forms, sorted: what a held-back piece may be the beginning of.
    forms: BTreeSet<Vec<u8>>,
    /// Which bytes begin some form.
    first_bytes: [bool; 256],
    longest: usize,
}

/// A stretch of text to replace, in byte offsets of the text scanned.
pub(super) type Span = std::ops::Range<usize>;

impl Matcher {
    /// Compiles `forms`; `None` when there are none (or the automaton
    /// cannot be built, which only a size limit could cause).
    pub(super) fn new(forms: BTreeSet<Vec<u8>>) -> Option<Self> {
        if forms.is_empty() {
            return None;
        }
        let dfa = match DFA::builder().match_kind(MatchKind::Standard).build(&forms) {
            Ok(dfa) => dfa,
            Err(error) => {
                tracing::error!(%error, "cannot compile the secrets to redact");
                return None;
            }
        };
        let mut first_bytes = [false; 256];
        for form in &forms {
            if let Some(first) = form.first() {
                first_bytes[usize::from(*first)] = true;
            }
        }
        let longest = forms.iter().map(Vec::len).max().unwrap_or(0);
        Some(Self {
            dfa,
            forms,
            first_bytes,
            longest,
        })
    }

    /// The stretches of `text` that hold a form, whitespace inside them
    /// included, in order and merged where they overlap.
    pub(super) fn spans(&self, text: &[u8]) -> Vec<Span> {
        let mut spans: Vec<Span> = Vec::new();
        self.scan(text, false, |end, length| {
            push_merged(&mut spans, start_of(text, end, length)..end + 1);
            true
        });
        spans
    }

    /// Whether serialized JSON holds a form in one of its strings, where
    /// the escapes `\n`, `\r`, `\t` and `\f` count as whitespace too (a
    /// first look; matches are then looked for in the strings themselves).
    pub(super) fn is_match_json(&self, json: &[u8]) -> bool {
        let mut found = false;
        self.scan(json, true, |_, _| {
            found = true;
            false
        });
        found
    }

    /// Runs the automaton over `text`, whitespace skipped, calling
    /// `on_match(index of the last byte, length of the longest form ending
    /// there, whitespace not counted)` until it answers false.
    fn scan(&self, text: &[u8], json: bool, mut on_match: impl FnMut(usize, usize) -> bool) {
        let Ok(mut state) = self.dfa.start_state(Anchored::No) else {
            return;
        };
        let mut index = 0;
        while index < text.len() {
            let byte = text[index];
            if is_space(byte) {
                index += 1;
                continue;
            }
            if json && byte == b'\\' && matches!(text.get(index + 1), Some(b'n' | b'r' | b't' | b'f')) {
                index += 2;
                continue;
            }
            state = self.dfa.next_state(Anchored::No, state, byte);
            if self.dfa.is_special(state) && self.dfa.is_match(state) {
                let length = (0..self.dfa.match_len(state))
                    .map(|which| self.dfa.pattern_len(self.dfa.match_pattern(state, which)))
                    .max()
                    .unwrap_or(1);
                if !on_match(index, length) {
                    return;
                }
            }
            index += 1;
        }
    }

    /// Where the end of `text` that could be the beginning of a form starts,
    /// if that end is at least [`MIN_HELD_BYTES`] long (whitespace not
    /// counted) and starts at or after `from`: streamed text keeps it back
    /// until the next piece shows whether the form goes on.
    pub(super) fn pending_start(&self, text: &[u8], from: usize) -> Option<usize> {
        // The last `longest - 1` non-space bytes, and where each is.
        let mut tail: Vec<(usize, u8)> = Vec::with_capacity(self.longest);
        for (index, byte) in text.iter().enumerate().skip(from).rev() {
            if tail.len() + 1 >= self.longest {
                break;
            }
            if !is_space(*byte) {
                tail.push((index, *byte));
            }
        }
        tail.reverse();
        let bytes: Vec<u8> = tail.iter().map(|(_, byte)| *byte).collect();
        (0..bytes.len().saturating_sub(MIN_HELD_BYTES - 1))
            .filter(|start| self.first_bytes[usize::from(bytes[*start])])
            .find(|start| self.begins_a_form(&bytes[*start..]))
            .map(|start| tail[start].0)
    }

    /// Whether `piece` is the beginning of some form (the first form not
    /// below it in sort order starts with it, if any does).
    fn begins_a_form(&self, piece: &[u8]) -> bool {
        self.forms
            .range::<[u8], _>((std::ops::Bound::Included(piece), std::ops::Bound::Unbounded))
            .next()
            .is_some_and(|form| form.starts_with(piece))
    }
}

/// Where a match of `length` non-space bytes that ends at `end` starts
/// (matches are rare: walking back is cheaper than tracking every byte).
fn start_of(text: &[u8], end: usize, length: usize) -> usize {
    let mut remaining = length;
    let mut index = end + 1;
    while remaining > 0 && index > 0 {
        index -= 1;
        if !is_space(text[index]) {
            remaining -= 1;
        }
    }
    index
}

/// Adds `span` to `spans` (in order of their ends), merged with the spans
/// it overlaps or touches.
fn push_merged(spans: &mut Vec<Span>, span: Span) {
    while let Some(last) = spans.last()
        && last.end >= span.start
        && last.start >= span.start
    {
        spans.pop();
    }
    match spans.last_mut() {
        Some(last) if last.end >= span.start => last.end = last.end.max(span.end),
        _ => spans.push(span),
    }
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init, reason = "spans are lists of ranges")]
mod tests {
    use super::*;

    fn matcher(secrets: &[&str]) -> Matcher {
        Matcher::new(secrets.iter().flat_map(|secret| forms_of(secret)).collect()).expect("matcher")
    }

    #[test]
    fn cores_are_found_in_every_encoding_of_text_around_the_secret() {
        let secret = "sk-live-0123456789abcdef~~??";
        let found = matcher(&[secret]);
        for prefix in ["", "a", "ab", "abc"] {
            for suffix in ["", "z", "zy"] {
                let data = format!("{prefix}{secret}{suffix}");
                for engine in [
                    &base64::engine::general_purpose::STANDARD,
                    &STANDARD_NO_PAD,
                    &base64::engine::general_purpose::URL_SAFE,
                    &URL_SAFE_NO_PAD,
                ] {
                    let encoded = engine.encode(&data);
                    let spans = found.spans(encoded.as_bytes());
                    assert_eq!(spans.len(), 1, "{prefix:?} {suffix:?} {encoded}");
                    // At most the characters shared with the bytes around it stay.
                    let kept = encoded.len() - spans[0].len();
                    assert!(kept <= 4 + prefix.len() * 2 + suffix.len() * 2 + 2, "{encoded}");
                }
            }
        }
    }

    #[test]
    fn whitespace_inside_a_form_is_skipped_and_kept_in_the_span() {
        let found = matcher(&["sk-0123456789"]);
        let text = b"key: sk-01234 56789\n done";
        assert_eq!(found.spans(text), [5..19]);
        assert!(found.is_match_json(br#"{"a":"sk-0123\n456789"}"#));
        assert!(found.spans(b"sk-0123-456789").is_empty());
    }

    #[test]
    fn overlapping_matches_merge() {
        let found = matcher(&["abcdefgh12", "gh12345678"]);
        assert_eq!(found.spans(b"..abcdefgh12345678.."), [2..18]);
        let mut spans = vec![0..3, 5..8];
        push_merged(&mut spans, 2..10);
        assert_eq!(spans, [0..10]);
    }

    #[test]
    fn only_an_end_of_four_bytes_or_more_is_held_back() {
        let found = matcher(&["sk-0123456789"]);
        assert_eq!(found.pending_start(b"hello sk-01", 0), Some(6));
        assert_eq!(found.pending_start(b"hello sk-0 1", 0), Some(6));
        assert_eq!(
            found.pending_start(b"hello sk-", 0),
            None,
            "three bytes: its tail is a form"
        );
        assert_eq!(found.pending_start(b"hello sk-01", 8), None);
        assert_eq!(found.pending_start(b"hello world", 0), None);
        assert_eq!(found.spans(b"-0123456789").len(), 1, "the tail after `sk`");
    }
}
