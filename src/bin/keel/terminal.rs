//! Making untrusted text safe to write to a terminal.
//!
//! Model text, tool output and arguments, errors and stored titles can hold
//! escape sequences that a terminal acts on: an OSC 52 clipboard write, a
//! title change, a screen clear, a carriage return that overwrites the line
//! before it, or a bidi override that shows text in another order than it is
//! stored. Everything `keel run`, `keel chat`, `keel events`,
//! `keel sessions` and `keel fork` print as text (and every error) goes
//! through [`terminal_safe`] first; the `--json` output does not (it is
//! JSON for programs, not a terminal).

use std::borrow::Cow;
use std::fmt::Write;

/// `text` with every character a terminal could act on shown as `\u{XX}`
/// (its code point in hex, the way Rust writes it): C0 controls other than
/// newline and tab, DEL, C1 controls (U+0080–U+009F, in their UTF-8 form),
/// the bidi embeddings, overrides and isolates (U+202A–U+202E,
/// U+2066–U+2069), and a carriage return not directly followed by a newline
/// in `text` (a lone one moves the cursor back over what was printed; one
/// ending a streamed piece is escaped, since what follows is not known).
///
/// Each character is judged alone (apart from that lookahead for CR), so
/// streamed text can be escaped piece by piece without buffering: an escape
/// sequence split across pieces still has its introducer escaped.
pub(crate) fn terminal_safe(text: &str) -> Cow<'_, str> {
    let flagged = |(at, c): &(usize, char)| is_unsafe(*c, text[at + c.len_utf8()..].chars().next());
    let Some((first, _)) = text.char_indices().find(flagged) else {
        return Cow::Borrowed(text);
    };
    let mut safe = String::with_capacity(text.len() + 8);
    safe.push_str(&text[..first]);
    for (at, c) in text[first..].char_indices().map(|(at, c)| (first + at, c)) {
        if flagged(&(at, c)) {
            // Writing to a String cannot fail.
            let _ = write!(safe, "\\u{{{:x}}}", u32::from(c));
        } else {
            safe.push(c);
        }
    }
    Cow::Owned(safe)
}

/// Whether `c` (followed by `next`, if any) is shown escaped.
fn is_unsafe(c: char, next: Option<char>) -> bool {
    match c {
        '\n' | '\t' => false,
        '\r' => next != Some('\n'),
        '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' => true,
        '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_borrowed_unchanged() {
        for text in ["", "hello", "two\nlines\tand a tab", "crlf\r\nend", "ünïcødé ✓ 日本"] {
            assert!(
                matches!(terminal_safe(text), Cow::Borrowed(same) if same == text),
                "{text:?}"
            );
        }
    }

    #[test]
    fn escape_sequences_show_as_code_points() {
        assert_eq!(
            terminal_safe("\u{1b}]52;c;aGVsbG8=\u{7}"),
            "\\u{1b}]52;c;aGVsbG8=\\u{7}"
        );
        assert_eq!(terminal_safe("\u{1b}]0;title\u{7}"), "\\u{1b}]0;title\\u{7}");
        assert_eq!(terminal_safe("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(terminal_safe("\u{9b}31m"), "\\u{9b}31m");
        assert_eq!(terminal_safe("x\u{7f}\u{0}\u{8}"), "x\\u{7f}\\u{0}\\u{8}");
        assert_eq!(terminal_safe("\u{85}\u{9c}"), "\\u{85}\\u{9c}");
    }

    #[test]
    fn bidi_overrides_and_isolates_are_escaped() {
        assert_eq!(terminal_safe("abc\u{202e}fed"), "abc\\u{202e}fed");
        assert_eq!(terminal_safe("\u{202a}\u{2066}\u{2069}"), "\\u{202a}\\u{2066}\\u{2069}");
        // Neighbours that are not overrides stay.
        assert_eq!(terminal_safe("\u{2029}\u{2065}\u{206a}"), "\u{2029}\u{2065}\u{206a}");
    }

    #[test]
    fn a_carriage_return_is_kept_only_before_a_newline() {
        assert_eq!(terminal_safe("ok\r\n"), "ok\r\n");
        assert_eq!(terminal_safe("secret\rshown"), "secret\\u{d}shown");
        // At the end of a streamed piece what follows is unknown.
        assert_eq!(terminal_safe("end\r"), "end\\u{d}");
        assert_eq!(terminal_safe("\r\r\n"), "\\u{d}\r\n");
    }

    #[test]
    fn pieces_escaped_apart_hide_what_the_whole_hides() {
        let whole = "start \u{1b}]52;c;aGVsbG8=\u{7} mid \u{9b}31m \u{202e}end";
        let pieces: String = whole
            .chars()
            .map(|c| terminal_safe(&c.to_string()).into_owned())
            .collect();
        assert_eq!(pieces, terminal_safe(whole));
        assert!(!pieces.chars().any(|c| is_unsafe(c, None)), "{pieces:?}");
    }
}
