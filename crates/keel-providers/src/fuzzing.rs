//! Fuzzing entry points for the SSE parser and each provider's stream decoder, which give the same result however
//! the bytes are split (feature `fuzzing`, which only
//! `keel-testing` turns on): each takes arbitrary bytes and must never
//! panic; a failed check panics, which the fuzzer reports as a crash. They
//! live here because they reach this crate's internals.

use keel_model::{ModelEvent, ModelEventSink};
use std::sync::Arc;

use crate::anthropic::Anthropic;
use crate::http::{EventStream, HttpSettings};
use crate::openai_chat::OpenAiChat;
use crate::openai_responses::OpenAiResponses;
use crate::sse::{SseError, SseEvent, SseParser};
use crate::{Emitter, HttpModel, ProviderSettings, WireFormat};

/// The SSE parser over `data`, whole and in pieces, with a small and a
/// large event bound: the events (and the error, if any) must be the same
/// however the bytes are split, and no event may exceed the bound.
pub fn sse(data: &[u8]) {
    for max_event_bytes in [64, 4096] {
        let whole = parse_sse(data, max_event_bytes, &[data.len()]);
        let piece = piece_size(data);
        let pieces = parse_sse(data, max_event_bytes, &[piece]);
        assert_eq!(whole, pieces, "split in pieces of {piece} bytes");
        let third = parse_sse(data, max_event_bytes, &[data.len() / 3, 1, 2]);
        assert_eq!(whole, third, "split at a third");
        for event in &whole.0 {
            assert!(event.data.len() <= max_event_bytes, "an event beyond the bound");
            let name = event.event.as_deref().unwrap_or_default();
            assert!(name.len() <= max_event_bytes, "an event name beyond the bound");
        }
    }
}

/// What parsing a stream gave: its events, then the error or whether it
/// stopped in the middle of an event.
type SseOutcome = (Vec<SseEvent>, Result<bool, SseError>);

/// Parses `data` in pieces of the sizes in `sizes` (the last one repeated).
fn parse_sse(data: &[u8], max_event_bytes: usize, sizes: &[usize]) -> SseOutcome {
    let mut parser = SseParser::new(max_event_bytes);
    let mut events = Vec::new();
    let mut rest = data;
    let mut index = 0;
    while !rest.is_empty() {
        let size = sizes
            .get(index)
            .or(sizes.last())
            .copied()
            .unwrap_or(1)
            .clamp(1, rest.len());
        let (piece, tail) = rest.split_at(size);
        if let Err(error) = parser.push(piece, &mut events) {
            return (events, Err(error));
        }
        rest = tail;
        index += 1;
    }
    let partial = parser.has_partial_event();
    (events, Ok(partial))
}

/// A piece size that depends on the input, so that the fuzzer explores
/// splits without spending bytes of its input on them.
fn piece_size(data: &[u8]) -> usize {
    const SIZES: [usize; 8] = [1, 2, 3, 5, 7, 16, 64, 4096];
    SIZES[data.len() % SIZES.len()]
}

/// The settings the decoders run with: a small event bound, so that inputs
/// of fuzzing size reach it.
fn fuzz_settings(name: &str) -> ProviderSettings {
    let mut settings = ProviderSettings::new(name, "fuzz-model", "http://127.0.0.1:9");
    settings.http = HttpSettings {
        max_event_bytes: 2048,
        max_response_bytes: 1 << 20,
        ..HttpSettings::default()
    };
    settings
}

thread_local! {
    static RUNTIME: Option<tokio::runtime::Runtime> =
        tokio::runtime::Builder::new_current_thread().enable_time().build().ok();
    static CHAT: Option<OpenAiChat> = OpenAiChat::new(fuzz_settings("fuzz-chat")).ok();
    static RESPONSES: Option<OpenAiResponses> = OpenAiResponses::new(fuzz_settings("fuzz-responses")).ok();
    static MESSAGES: Option<Anthropic> = Anthropic::new(fuzz_settings("fuzz-messages")).ok();
}

/// The OpenAI Chat Completions stream decoder over `data` (see
/// `read_body` for how the bytes are the body).
pub fn openai_chat(data: &[u8]) {
    CHAT.with(|model| {
        if let Some(model) = model {
            read_body(model, "fuzz-chat", data);
        }
    });
}

/// The OpenAI Responses stream decoder over `data`.
pub fn openai_responses(data: &[u8]) {
    RESPONSES.with(|model| {
        if let Some(model) = model {
            read_body(model, "fuzz-responses", data);
        }
    });
}

/// The Anthropic Messages stream decoder over `data`.
pub fn anthropic(data: &[u8]) {
    MESSAGES.with(|model| {
        if let Some(model) = model {
            read_body(model, "fuzz-messages", data);
        }
    });
}

/// Reads `data` as a response body with `reader`, the way a provider reads
/// one off the network: data starting with `{` is a complete JSON answer
/// (as a server that does not stream sends one), anything else an event
/// stream. The stream is read twice, whole and arriving in pieces of a size
/// that depends on the input: the step's output, what was streamed while
/// it ran, and whether it failed must not depend on where the network cut
/// the bytes.
fn read_body<W: WireFormat>(reader: &HttpModel<W>, provider: &str, data: &[u8]) {
    let settings = fuzz_settings(provider).http;
    if data.trim_ascii_start().starts_with(b"{") {
        // The HTTP layer refuses a JSON answer that does not parse.
        let Ok(json) = serde_json::from_slice(data) else {
            return;
        };
        read_once(
            reader,
            EventStream::from_chunks(provider, &settings, Vec::new(), Some(json)),
        );
        return;
    }
    let pieces = |size: usize| -> Vec<bytes::Bytes> { data.chunks(size).map(bytes::Bytes::copy_from_slice).collect() };
    let whole = read_once(
        reader,
        EventStream::from_chunks(provider, &settings, pieces(data.len().max(1)), None),
    );
    let split = read_once(
        reader,
        EventStream::from_chunks(provider, &settings, pieces(piece_size(data)), None),
    );
    assert_eq!(whole, split, "the same stream decoded differently when split");
}

/// What one read of a stream gave: the output (or that it failed) and the
/// text and reasoning streamed while it ran.
#[derive(Debug, PartialEq)]
struct Read {
    output: Option<keel_model::ModelOutput>,
    streamed: String,
    reasoned: String,
}

fn read_once<W: WireFormat>(reader: &HttpModel<W>, stream: EventStream) -> Option<Read> {
    let seen = Arc::new(std::sync::Mutex::new((String::new(), String::new())));
    let sink: ModelEventSink = {
        let seen = Arc::clone(&seen);
        Arc::new(move |event| {
            let mut seen = seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match event {
                ModelEvent::TextDelta(text) => seen.0.push_str(&text),
                ModelEvent::ReasoningDelta(text) => seen.1.push_str(&text),
            }
            Ok(())
        })
    };
    let mut emitter = Emitter::new(sink);
    RUNTIME.with(|runtime| {
        let runtime = runtime.as_ref()?;
        let mut output = runtime.block_on(reader.read(stream, &mut emitter)).ok();
        // A call the provider sent without an id gets a fresh one each time.
        for call in output.iter_mut().flat_map(|output| output.tool_calls.iter_mut()) {
            let generated = call
                .call_id
                .strip_prefix("call_")
                .is_some_and(|id| uuid::Uuid::parse_str(id).is_ok());
            if generated {
                call.call_id = "call_<generated>".to_owned();
            }
        }
        if let Some(output) = &output {
            // What a step produced is recorded as JSON: it must serialize.
            for item in &output.reasoning {
                assert!(
                    serde_json::to_string(item).is_ok(),
                    "a reasoning item does not serialize"
                );
            }
        }
        let (streamed, reasoned) = std::mem::take(&mut *seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        Some(Read {
            output,
            streamed,
            reasoned,
        })
    })
}
