//! Secrets in what a session commits: a provider key echoed by the model in
//! another form (base64, split by whitespace, streamed across deltas, in a
//! tool call's arguments) is stored redacted, read back from the SQLite
//! file a real session wrote.

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use keel::agent::StreamingOptions;
use keel::model::ScriptedModel;
use keel::secrets::register;
use std::sync::Arc;

use crate::suite::support::agent::{read_turn, shutdown, start_agent, user};
use crate::suite::support::store::{TestDb, stored_events};

/// Runs one turn of a script model answering with `lines`, streaming every
/// delta on its own, and returns everything the store holds for the
/// session afterwards (its events and its history) as JSON text.
async fn stored_after(lines: &[serde_json::Value]) -> String {
    let db = TestDb::new();
    let script = db.workspace().join("script.jsonl");
    let text: Vec<String> = lines.iter().map(serde_json::Value::to_string).collect();
    std::fs::write(&script, text.join("\n")).expect("write the script");
    let model = Arc::new(ScriptedModel::load(&script).expect("load the script"));
    let store = db.open();
    let mut agent = start_agent(&db, &store, "s", model, StreamingOptions::per_delta()).await;
    agent.sender().submit(user("go")).expect("submit");
    let turn = read_turn(&mut agent).await;
    assert_eq!(
        turn.last().map(|event| event.msg.kind()),
        Some("turn_complete"),
        "{turn:?}"
    );
    shutdown(agent).await;
    // A new store on the file, as another process would read it.
    let store = db.open();
    let events = stored_events(&store, "s").await;
    let state = keel::CheckpointStore::load(&*store, "s")
        .await
        .expect("load")
        .expect("the session");
    format!(
        "{}\n{}",
        serde_json::to_string(&events).expect("events"),
        serde_json::to_string(&state.transcript).expect("history")
    )
}

/// Asserts no stretch of `len` characters of `secret_text` is in `stored`.
fn assert_no_piece(stored: &str, secret_text: &str, len: usize, what: &str) {
    let chars: Vec<char> = secret_text.chars().collect();
    for window in chars.windows(len) {
        let piece: String = window.iter().collect();
        assert!(!stored.contains(&piece), "{what}: {piece:?} stored in {stored}");
    }
}

#[tokio::test]
async fn a_key_echoed_base64_encoded_is_stored_redacted_in_every_alphabet_offset_and_padding() {
    // Bytes that make `+` and `/` in standard base64, so both alphabets differ.
    let secret = "sk-b64-~~~???>>>0123456789abcdef";
    register(secret);
    for engine in [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD] {
        for (offset, prefix) in ["", "a", "ab"].into_iter().enumerate() {
            for suffix in ["", "x", "xy"] {
                let encoded = engine.encode(format!("{prefix}{secret}{suffix}"));
                let stored =
                    stored_after(&[serde_json::json!({"text": format!("the key, encoded: {encoded} (ok)")})]).await;
                assert!(stored.contains("[redacted]"), "offset {offset}: {stored}");
                // Only the few characters shared with the bytes around the
                // key may stay.
                let core = &encoded[4..encoded.len() - 4];
                assert_no_piece(
                    &stored,
                    core,
                    8,
                    &format!("offset {offset}, suffix {suffix:?}: {encoded}"),
                );
            }
        }
    }
    assert_ne!(STANDARD.encode(secret), URL_SAFE.encode(secret));
}

#[tokio::test]
async fn a_key_split_by_whitespace_is_stored_redacted() {
    let secret = "sk-split-0123456789abcdef";
    register(secret);
    for split in [
        "sk-split-01 23456789abcdef",
        "sk-split-0123\n456789\tabcdef",
        "s k - s p l i t - 0 1 2 3 4 5 6 7 8 9 a b c d e f",
    ] {
        let stored = stored_after(&[serde_json::json!({"text": format!("key: {split} end")})]).await;
        assert!(stored.contains("key: [redacted] end"), "{split:?}: {stored}");
        assert!(!stored.contains("456789"), "{split:?}: {stored}");
    }
}

#[tokio::test]
async fn a_key_streamed_across_deltas_is_stored_redacted_in_the_deltas_and_the_message() {
    let secret = "sk-stream-0123456789abcdef";
    register(secret);
    for chunks in [
        vec!["The key is sk-str", "eam-0123456789", "abcdef, and more."],
        vec!["The key is sk-stream-0", "1", "2", "3456789abcdef", ", and more."],
        // Split after its first bytes: the rest is found by itself.
        vec!["The key is sk", "-stream-0123456789abcdef, and more."],
    ] {
        let stored = stored_after(&[serde_json::json!({"chunks": chunks})]).await;
        assert!(stored.contains("[redacted], and more."), "{chunks:?}: {stored}");
        assert_no_piece(&stored, &secret[3..], 6, &format!("{chunks:?}"));
        assert!(stored.contains("The key is "), "{stored}");
    }
}

#[tokio::test]
async fn a_key_in_a_tool_calls_arguments_is_stored_redacted() {
    let secret = "sk-args-0123456789abcdef";
    register(secret);
    let call = serde_json::json!({"tool_calls": [{
        "id": "call-1",
        "name": "no_such_tool",
        "arguments": {"url": format!("https://example.com/?key={secret}"), "header": format!("Bearer {secret}")},
    }]});
    let stored = stored_after(&[call, serde_json::json!({"text": "done"})]).await;
    assert!(stored.contains("tool_call"), "{stored}");
    assert!(stored.contains("[redacted]"), "{stored}");
    assert!(!stored.contains("0123456789abcdef"), "{stored}");
}

/// Credentials of a shape Keel knows, never registered with this process:
/// a Keel API key (made by another server, or pasted by a user) and a JWT,
/// streamed across deltas and whole, are stored redacted by their shape.
#[tokio::test]
async fn a_keel_key_and_a_jwt_are_stored_redacted_by_their_shape() {
    let key = "keel_9f8e7d6c5b4a3210_Zm9vYmFyYmF6cXV4cXV1eGNvcmdlZ3JhdWx0Z2FycGx";
    let jwt =
        "eyJhbGciOiJFUzI1NiIsImtpZCI6ImVjLTEifQ.eyJzdWIiOiJib2IiLCJvcmciOiJnbG9iZXgifQ.c2lnbmF0dXJlc2lnbmF0dXJlc2ln";
    for chunks in [
        vec![format!("key {key} and jwt {jwt}, done.")],
        vec![
            "key kee".to_owned(),
            format!("l{}", &key[4..30]),
            format!("{} and jwt ey", &key[30..]),
            format!("{} done.", &jwt[2..]),
        ],
    ] {
        let stored = stored_after(&[serde_json::json!({"chunks": chunks})]).await;
        assert!(
            stored.contains("key [redacted] and jwt [redacted]"),
            "{chunks:?}: {stored}"
        );
        assert_no_piece(&stored, &key[5..], 10, "the key");
        assert_no_piece(&stored, &jwt[40..], 10, "the JWT");
    }
}
