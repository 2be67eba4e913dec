//! Fuzzing entry points for the protocol's JSON and the body of `POST .../submissions`: whatever parses serializes
//! to JSON that parses to the same value (feature `fuzzing`, which only
//! `keel-testing` turns on): each takes arbitrary bytes and must never
//! panic; a failed check panics, which the fuzzer reports as a crash. They
//! live here because they reach this crate's internals.

use std::fmt::Debug;

use serde::Serialize;
use serde::de::DeserializeOwned;

use keel_protocol::{Event, Op, RecordedEvent, TranscriptItem};

use crate::routes::submissions::{SubmitRequest, check_op};

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
            assert!(serde_json::from_slice::<keel_agent::BusyPolicy>(&json).is_ok_and(|again| again == policy));
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
