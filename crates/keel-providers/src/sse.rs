//! A server-sent events parser that survives real networks.
//!
//! Bytes arrive in arbitrary pieces: a line, a CRLF pair or a multi-byte
//! UTF-8 character can be split across reads. The parser buffers until a
//! line is complete, and decodes text only per complete line. It follows the
//! WHATWG event-stream rules: lines end with CRLF, LF or CR; a line starting
//! with `:` is a comment (keep-alive); `data:` lines accumulate (joined with
//! `\n`); a blank line dispatches the event. Both a line and an event's data
//! are bounded, so a hostile stream cannot grow memory without limit.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, if any.
    pub event: Option<String>,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
}

/// Why the stream could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SseError {
    /// A line or an event's data grew past the limit.
    #[error("an event exceeded {0} bytes")]
    TooLarge(usize),
    /// A line was not valid UTF-8.
    #[error("a line of the stream is not valid UTF-8")]
    InvalidUtf8,
}

/// Incremental parser; feed it bytes as they arrive.
#[derive(Debug)]
pub struct SseParser {
    max_event_bytes: usize,
    /// The current, incomplete line.
    line: Vec<u8>,
    /// The previous byte was a CR, so an LF now ends nothing.
    after_cr: bool,
    event: Option<String>,
    data: String,
    /// Whether any `data:` line was seen for the current event.
    has_data: bool,
}

impl SseParser {
    /// A parser refusing lines or events larger than `max_event_bytes`.
    pub fn new(max_event_bytes: usize) -> Self {
        Self {
            max_event_bytes,
            line: Vec::new(),
            after_cr: false,
            event: None,
            data: String::new(),
            has_data: false,
        }
    }

    /// Parses `bytes`, appending every event they complete to `events`.
    pub fn push(&mut self, bytes: &[u8], events: &mut Vec<SseEvent>) -> Result<(), SseError> {
        for &byte in bytes {
            match byte {
                b'\n' if self.after_cr => self.after_cr = false,
                b'\n' | b'\r' => {
                    self.after_cr = byte == b'\r';
                    let line = std::mem::take(&mut self.line);
                    self.end_line(&line, events)?;
                }
                _ => {
                    self.after_cr = false;
                    if self.line.len() >= self.max_event_bytes {
                        return Err(SseError::TooLarge(self.max_event_bytes));
                    }
                    self.line.push(byte);
                }
            }
        }
        Ok(())
    }

    /// Whether the stream stopped in the middle of an event (a line or data
    /// not yet dispatched): an event that never got its blank line.
    pub fn has_partial_event(&self) -> bool {
        !self.line.is_empty() || self.has_data || self.event.is_some()
    }

    fn end_line(&mut self, line: &[u8], events: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if line.is_empty() {
            if self.has_data {
                let mut data = std::mem::take(&mut self.data);
                if data.ends_with('\n') {
                    data.pop();
                }
                events.push(SseEvent {
                    event: self.event.take(),
                    data,
                });
            }
            self.event = None;
            self.has_data = false;
            return Ok(());
        }
        let line = std::str::from_utf8(line).map_err(|_| SseError::InvalidUtf8)?;
        if line.starts_with(':') {
            return Ok(());
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "data" => {
                if self.data.len() + value.len() + 1 > self.max_event_bytes {
                    return Err(SseError::TooLarge(self.max_event_bytes));
                }
                self.data.push_str(value);
                self.data.push('\n');
                self.has_data = true;
            }
            "event" => self.event = Some(value.to_owned()),
            // Not in the standard, but llama.cpp's server reports a failure
            // mid-stream as an `error:` line; surfacing it as an `error`
            // event lets the provider's own message reach the user.
            "error" => {
                if self.data.len() + value.len() + 1 > self.max_event_bytes {
                    return Err(SseError::TooLarge(self.max_event_bytes));
                }
                self.event = Some("error".to_owned());
                self.data.push_str(value);
                self.data.push('\n');
                self.has_data = true;
            }
            // `id` and `retry` serve reconnecting browsers; a model response
            // is one request, so they are ignored, like unknown fields.
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_pieces(stream: &[u8], piece: usize) -> Vec<SseEvent> {
        let mut parser = SseParser::new(1 << 20);
        let mut events = Vec::new();
        for chunk in stream.chunks(piece.max(1)) {
            parser.push(chunk, &mut events).expect("parse");
        }
        assert!(!parser.has_partial_event(), "the stream ended cleanly");
        events
    }

    fn event(name: Option<&str>, data: &str) -> SseEvent {
        SseEvent {
            event: name.map(str::to_owned),
            data: data.to_owned(),
        }
    }

    #[test]
    fn every_split_point_gives_the_same_events() {
        let stream = "event: message_start\r\ndata: {\"a\":\"héllo 🌍\"}\r\n\r\n: keep-alive\n\ndata: line one\ndata: line two\n\ndata:[DONE]\r\r"
            .as_bytes();
        let expected = vec![
            event(Some("message_start"), "{\"a\":\"héllo 🌍\"}"),
            event(None, "line one\nline two"),
            event(None, "[DONE]"),
        ];
        for piece in 1..stream.len() {
            assert_eq!(parse_in_pieces(stream, piece), expected, "pieces of {piece} bytes");
        }
        // Every single split point, in two pieces.
        for split in 0..stream.len() {
            let mut parser = SseParser::new(1 << 20);
            let mut events = Vec::new();
            parser.push(&stream[..split], &mut events).expect("first part");
            parser.push(&stream[split..], &mut events).expect("second part");
            assert_eq!(events, expected, "split at {split}");
        }
    }

    #[test]
    fn an_error_line_is_an_error_event() {
        let stream =
            b"data: {\"choices\": []}\n\nerror: {\"code\": 500, \"message\": \"out of memory\"}\n\ndata: [DONE]\n\n";
        let events = parse_in_pieces(stream, 4);
        assert_eq!(
            events[1],
            event(Some("error"), "{\"code\": 500, \"message\": \"out of memory\"}")
        );
        assert_eq!(events.len(), 3);
    }

    #[test]
    fn comments_unknown_fields_and_events_without_data_dispatch_nothing() {
        assert_eq!(
            parse_in_pieces(b": ping\n\nid: 7\nretry: 10\n\nevent: ping\n\n", 3),
            vec![]
        );
    }

    #[test]
    fn a_stream_cut_mid_event_is_detected() {
        let mut parser = SseParser::new(1024);
        let mut events = Vec::new();
        parser.push(b"data: {\"partial\": tr", &mut events).expect("parse");
        assert!(events.is_empty());
        assert!(parser.has_partial_event());
        let mut parser = SseParser::new(1024);
        parser.push(b"data: complete line\n", &mut events).expect("parse");
        assert!(
            parser.has_partial_event(),
            "data without its blank line is not an event yet"
        );
    }

    #[test]
    fn oversized_lines_and_events_and_bad_utf8_are_errors() {
        let mut events = Vec::new();
        assert_eq!(
            SseParser::new(16).push(&[b'x'; 17], &mut events),
            Err(SseError::TooLarge(16))
        );
        let many_lines = "data: 0123456789\n".repeat(3);
        assert_eq!(
            SseParser::new(24).push(many_lines.as_bytes(), &mut events),
            Err(SseError::TooLarge(24))
        );
        assert_eq!(
            SseParser::new(64).push(b"data: \xff\xfe\n\n", &mut events),
            Err(SseError::InvalidUtf8)
        );
    }
}
