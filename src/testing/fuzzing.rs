//! Entry points for fuzzing: each takes arbitrary bytes and must never
//! panic. The `fuzz/` cargo-fuzz project calls one per target, and the
//! stable test `tests/suite/fuzz_seeds.rs` runs them over the seed corpora
//! (`fuzz/corpus/<target>/`) and mutations of them.
//!
//! Beyond not panicking, some check what must hold of any input: the SSE
//! parser and each provider's stream decoder give the same result however
//! the bytes are split, and whatever parses as protocol JSON serializes to
//! JSON that parses to the same value.
//! A failed check panics, which the fuzzer reports as a crash.

use std::fmt::Debug;
use std::path::Path;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::config::KeelConfig;
use crate::model::{ModelEvent, ModelEventSink};
use crate::protocol::{Event, Op, RecordedEvent, TranscriptItem};
use crate::provider::anthropic::Anthropic;
use crate::provider::http::{EventStream, HttpSettings};
use crate::provider::openai_chat::OpenAiChat;
use crate::provider::openai_responses::OpenAiResponses;
use crate::provider::sse::{SseError, SseEvent, SseParser};
use crate::provider::{Emitter, ProviderSettings, ReadStream};
use crate::server::routes::submissions::{SubmitRequest, check_op};
use crate::store::codec;
use crate::store::rows;

/// An entry point: takes any bytes, never panics.
pub type Entry = fn(&[u8]);

/// The targets, by name: the name of the fuzz target and of its corpus
/// directory, and its entry point.
pub const TARGETS: &[(&str, Entry)] = &[
    ("sse", sse),
    ("openai_chat", openai_chat),
    ("openai_responses", openai_responses),
    ("anthropic", anthropic),
    ("protocol_json", protocol_json),
    ("store_codec", store_codec),
    ("keel_toml", keel_toml),
];

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
/// [`read_body`] for how the bytes are the body).
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
fn read_body(reader: &impl ReadStream, provider: &str, data: &[u8]) {
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
    output: Option<crate::model::ModelOutput>,
    streamed: String,
    reasoned: String,
}

fn read_once(reader: &impl ReadStream, stream: EventStream) -> Option<Read> {
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
        let mut output = runtime.block_on(reader.read_stream(stream, &mut emitter)).ok();
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

/// The protocol's JSON: [`Op`], the body of `POST .../submissions`,
/// [`RecordedEvent`], [`Event`] and [`TranscriptItem`]. Whatever parses
/// must serialize, and parse again to the same value.
pub fn protocol_json(data: &[u8]) {
    round_trip::<Op>(data);
    round_trip::<RecordedEvent>(data);
    round_trip::<Event>(data);
    round_trip::<TranscriptItem>(data);
    if let Ok(request) = serde_json::from_slice::<SubmitRequest>(data) {
        _ = check_op(&request.op);
        let json = serde_json::to_vec(&request.op).unwrap_or_default();
        round_trip::<Op>(&json);
        if let Some(policy) = request.on_busy {
            let json = serde_json::to_vec(&policy).unwrap_or_default();
            assert!(serde_json::from_slice::<crate::agent::BusyPolicy>(&json).is_ok_and(|again| again == policy));
        }
    }
}

fn round_trip<T: Serialize + DeserializeOwned + PartialEq + Debug>(data: &[u8]) {
    let Ok(value) = serde_json::from_slice::<T>(data) else {
        return;
    };
    let json = match serde_json::to_string(&value) {
        Ok(json) => json,
        Err(error) => panic!("{value:?} parsed but does not serialize: {error}"),
    };
    match serde_json::from_str::<T>(&json) {
        Ok(again) => assert_eq!(value, again, "{json} parses to another value"),
        Err(error) => panic!("{json}, serialized from {value:?}, does not parse: {error}"),
    }
}

/// The stored-value codec and the decoding of a log row. `data` is read as
/// the bytes of a stored value, and also as a row: 8 bytes of its first
/// sequence and 8 of its last (little endian), a byte of history cut, then
/// its stored value. Valid JSON in `data` must come back from encoding and
/// decoding as it went in, plain or compressed.
pub fn store_codec(data: &[u8]) {
    _ = codec::decode(data);
    if let Some((first, rest)) = data.split_first_chunk::<8>()
        && let Some((last, rest)) = rest.split_first_chunk::<8>()
        && let Some((cut, stored)) = rest.split_first()
    {
        let (first, last) = (u64::from_le_bytes(*first), u64::from_le_bytes(*last));
        let json = codec::decode(stored);
        if let Ok(events) = rows::decode_batch("s", first, last, &json) {
            let sequences: Vec<u64> = events.iter().map(|(sequence, _)| *sequence).collect();
            assert!(sequences.first().is_none_or(|sequence| *sequence == first));
            assert!(sequences.last().is_none_or(|sequence| *sequence == last));
        }
        let mut transcript = vec![TranscriptItem::UserMessage { text: "a".to_owned() }; 3];
        let cut = (*cut < 8).then_some(u64::from(*cut));
        if rows::apply_history_row(&mut transcript, "s", first, cut, Some(json)).is_ok() {
            assert!(cut.is_none_or(|cut| transcript.len() as u64 >= cut));
        }
    }
    if let Ok(text) = std::str::from_utf8(data)
        && serde_json::from_str::<serde_json::Value>(text).is_ok()
    {
        codec_round_trip(text.to_owned());
        // Large enough to be compressed, if it compresses.
        let copies = 512 / text.len().max(1) + 1;
        codec_round_trip(codec::json_array(std::iter::repeat_n(text, copies)));
    }
}

fn codec_round_trip(json: String) {
    let stored = codec::encode(json.clone()).into_bytes();
    match codec::decode(&stored) {
        Ok(decoded) => assert_eq!(decoded, json.into_bytes(), "a value came back changed"),
        Err(error) => panic!("an encoded value does not decode: {error}"),
    }
}

/// `keel.toml` parsing, as [`KeelConfig::load`] does it after reading the
/// file; a failure's message points into the text.
pub fn keel_toml(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        _ = KeelConfig::parse(text, Path::new("keel.toml"));
    }
}
