//! Event streams: resuming after a disconnect, and many subscribers with
//! one that stops reading.

use keel::protocol::RecordedEvent;
use keel::provider::sse::SseParser;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::suite::support::api::{Resume, metric_value};
use crate::suite::support::events::{ends_turn, sequences};
use crate::suite::support::server::{TestServer, slow_chunks};
use crate::suite::support::wait::{HANG_GUARD, guard, wait_until_async};

/// Asserts `events` are exactly the sequences `first..=last`.
fn assert_exactly(events: &[RecordedEvent], first: u64, last: u64) {
    assert_eq!(
        sequences(events),
        (first..=last).collect::<Vec<_>>(),
        "every sequence once, in order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_in_the_middle_of_a_turn_resumes_without_gap_or_duplicate() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server.scratch.script("s.jsonl", &[&slow_chunks(30, 30)]);
    server.api.create(json!({"id": "resume", "model": model})).await;
    let mut first = server.api.stream("resume", Resume::Start).await;
    server.api.say("resume", "Count").await;
    // Read into the streamed text, then drop the connection.
    let mut deltas = 0;
    let before_cut = first
        .until(|event| {
            deltas += usize::from(event.msg.kind() == "assistant_content_delta");
            deltas == 5
        })
        .await;
    drop(first);
    let cut = before_cut.last().expect("events").sequence;

    // Reconnect the way a browser does.
    let mut second = server.api.stream("resume", Resume::LastEventId(cut)).await;
    let mut after_reconnect = second
        .until(|event| event.msg.kind() == "assistant_content_delta")
        .await;
    let second_cut = after_reconnect.last().expect("events").sequence;
    drop(second);
    // And with `?after`.
    let mut third = server.api.stream("resume", Resume::After(second_cut)).await;
    after_reconnect.extend(third.until(ends_turn).await);

    let mut all = before_cut;
    all.extend(after_reconnect);
    let last = all.last().expect("events").sequence;
    assert_exactly(&all, 1, last);
    assert_eq!(all.last().map(|event| event.msg.kind()), Some("turn_complete"));
    // What was streamed is what is stored.
    let scratch = server.stop().await;
    let stored = scratch.stored("resume").await;
    assert_eq!(all, stored[..all.len()]);
}

/// The bytes of a `GET` sent as HTTP/1.0, so the body comes unchunked.
fn raw_get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n").into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nine_subscribers_get_everything_while_a_tenth_stalls_and_it_still_gets_every_event() {
    // A live buffer of 16 events, and a turn of about 6 MB in 16 KB
    // deltas: far more than the buffer and the socket buffers hold (Linux
    // grows a send buffer to 4 MB by default), so the stalled subscriber
    // falls behind the live channel and is served from the store.
    let server = TestServer::start(|config, _| config.live_buffer = 16).await;
    let chunk = "x".repeat(16 * 1024);
    let chunks: Vec<&str> = std::iter::repeat_n(chunk.as_str(), 384).collect();
    let line = json!({"chunks": chunks, "delay_ms": 1}).to_string();
    let model = server.scratch.script("s.jsonl", &[&line]);
    server.api.create(json!({"id": "fan", "model": model})).await;

    // The stalled subscriber: a raw socket with a fixed receive buffer that
    // reads only the response head, then nothing. The buffer is fixed so it
    // cannot grow to take the turn, and larger than a loopback segment
    // (64 KB): a window smaller than a segment reopens only at the sender's
    // persist-timer probes, a few KB a second, which the catching up would
    // then wait on.
    let address = server.api.base.trim_start_matches("http://").to_owned();
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(128 * 1024).expect("fixed receive buffer");
    let mut stalled = socket
        .connect(address.parse().expect("address"))
        .await
        .expect("connect");
    stalled
        .write_all(&raw_get("/v1/sessions/fan/events/stream"))
        .await
        .expect("send the request");
    let mut head = Vec::new();
    while !head.windows(4).any(|window| window == b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        guard("the stalled subscriber's response head", stalled.read_exact(&mut byte))
            .await
            .expect("read the head");
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.0 200") || head.starts_with(b"HTTP/1.1 200"));

    let mut readers = Vec::new();
    for _ in 0..9 {
        readers.push(server.api.stream("fan", Resume::Start).await);
    }
    server.api.say("fan", "Stream a lot").await;
    // The nine get the whole turn while the tenth reads nothing.
    let received = guard(
        "the nine readers",
        futures::future::join_all(readers.iter_mut().map(|reader| reader.until(ends_turn))),
    )
    .await;
    let last = received[0].last().expect("events").sequence;
    for events in &received {
        assert_exactly(events, 1, last);
        assert_eq!(events.last().map(|event| event.msg.kind()), Some("turn_complete"));
    }

    // Now the stalled one reads again: every event, in order, once.
    let mut parser = SseParser::new(64 * 1024 * 1024);
    let mut events: Vec<RecordedEvent> = Vec::new();
    let mut buffer = vec![0u8; 64 * 1024];
    guard("the stalled subscriber catching up", async {
        while events.last().is_none_or(|event| event.sequence < last) {
            let read = stalled.read(&mut buffer).await.expect("read the stream");
            assert!(read > 0, "the stream ended");
            let mut parsed = Vec::new();
            parser.push(&buffer[..read], &mut parsed).expect("well-formed");
            events.extend(
                parsed
                    .iter()
                    .map(|event| serde_json::from_str::<RecordedEvent>(&event.data).expect("event")),
            );
        }
    })
    .await;
    assert_exactly(&events, 1, last);
    assert_eq!(events, received[0]);
    let metrics = server.api.metrics().await;
    let catch_ups = metric_value(&metrics, "keel_subscriber_catch_ups_total");
    assert!(
        catch_ups >= 1.0,
        "the stalled subscriber was served from the store:\n{metrics}"
    );
    drop(stalled);
    // Until the server has seen it go: nine streams are left open.
    wait_until_async("the server to drop the stalled stream", HANG_GUARD, async || {
        metric_value(&server.api.metrics().await, "keel_sse_subscribers") < 10.0
    })
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stream_gets_keep_alive_comments_between_events() {
    // The test server sends a keep-alive comment after 1 s without events.
    let server = TestServer::start(|_, _| {}).await;
    let model = server.scratch.script("s.jsonl", &[r#"{"text": "Hi."}"#]);
    server.api.create(json!({"id": "quiet", "model": model})).await;
    let response = server
        .api
        .client
        .get(server.api.url("/v1/sessions/quiet/events/stream"))
        .send()
        .await
        .expect("open the stream");
    let header = |name: &str| response.headers().get(name).and_then(|value| value.to_str().ok());
    assert_eq!(header("content-type"), Some("text/event-stream"));
    assert_eq!(header("cache-control"), Some("no-cache"));
    assert_eq!(
        header("x-accel-buffering"),
        Some("no"),
        "proxies must not buffer the stream"
    );
    let mut body = response.bytes_stream();
    let mut text = String::new();
    guard("a keep-alive comment after the first event", async {
        while !text.contains(": keep-alive\n\n") {
            let chunk = futures::StreamExt::next(&mut body)
                .await
                .expect("the stream goes on")
                .expect("bytes");
            text.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
        }
    })
    .await;
    // The replayed event first, then the comment on the idle stream.
    assert!(text.starts_with("id: 1\nevent: session_started\n"), "{text}");
    assert!(text.ends_with("\n\n: keep-alive\n\n"), "{text}");
    // A comment is not an event: parsed, the stream holds the one event.
    let mut parser = SseParser::new(1024 * 1024);
    let mut parsed = Vec::new();
    parser.push(text.as_bytes(), &mut parsed).expect("well-formed");
    assert_eq!(parsed.len(), 1, "{parsed:?}");
}
