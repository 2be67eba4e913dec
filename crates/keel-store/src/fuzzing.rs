//! Fuzzing entry points for the stored-value codec and the decoding of log rows (feature `fuzzing`, which only
//! `keel-testing` turns on): each takes arbitrary bytes and must never
//! panic; a failed check panics, which the fuzzer reports as a crash. They
//! live here because they reach this crate's internals.

use keel_protocol::TranscriptItem;

use crate::{codec, rows};

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
