//! Every error status of the API, with its JSON body.

use std::time::Duration;

use keel::protocol::MAX_MESSAGE_BYTES;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::suite::support::api::{Reply, Resume};
use crate::suite::support::server::{TestServer, slow_chunks, unread_by_server};
use crate::suite::support::wait::{HANG_GUARD, guard, wait_for_async, wait_until, wait_until_async};

/// Asserts an error reply: status, code, and a message.
fn assert_error(reply: &Reply, status: StatusCode, code: &str) {
    assert_eq!(reply.status, status, "{}", reply.body);
    assert_eq!(reply.code(), code, "{}", reply.body);
    assert!(
        reply.body["error"]["message"]
            .as_str()
            .is_some_and(|message| !message.is_empty()),
        "{}",
        reply.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_400_and_unknown_things_404() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server.scratch.script("s.jsonl", &[r#"{"text": "Hi."}"#]);
    server.api.create(json!({"id": "s", "model": model})).await;
    let api = &server.api;

    let malformed = api
        .send(
            api.client
                .post(api.url("/v1/sessions/s/submissions"))
                .header("content-type", "application/json")
                .body("{not json"),
        )
        .await;
    assert_error(&malformed, StatusCode::BAD_REQUEST, "invalid_request");
    for body in [
        json!({"op": {"type": "user_input", "text": "hi"}, "extra": 1}),
        json!({"op": {"type": "launch_rockets"}}),
        json!({"op": {"type": "user_input", "text": "   "}}),
        json!({"op": {"type": "user_input", "text": "hi"}, "on_busy": "later"}),
        json!({}),
    ] {
        assert_error(&api.submit("s", body).await, StatusCode::BAD_REQUEST, "invalid_request");
    }
    for body in [
        json!({"id": "bad\u{7}id", "model": model}),
        json!({"id": "x".repeat(129), "model": model}),
        // Ids are printable ASCII: the bound is the same in bytes and in
        // characters, as the API's description states it.
        json!({"id": "caf\u{e9}", "model": model}),
        json!({"model": model, "bot_id": "b\u{f6}t"}),
        json!({"model": model, "tools": {"sandbox": "none"}}),
        json!({"model": model, "colour": "blue"}),
        // Objects are objects: serde would read a struct of defaults from
        // an array (found by schemathesis).
        json!({"model": model, "tools": []}),
        json!({"model": model, "tools": [true]}),
        json!({"model": model, "approvals": []}),
        json!([]),
        json!([model]),
    ] {
        assert_error(
            &api.post("/v1/sessions", &body).await,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        );
    }
    // A model this server cannot build: not a malformed request.
    assert_error(
        &api.post("/v1/sessions", &json!({"model": "nonsense-provider:x"})).await,
        StatusCode::NOT_FOUND,
        "model_not_found",
    );
    // No model anywhere: the server has no default.
    assert_error(
        &api.post("/v1/sessions", &json!({})).await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
    );
    for path in [
        "/v1/sessions?limit=0",
        "/v1/sessions?limit=501",
        "/v1/sessions/s/events?limit=1001",
        "/v1/sessions/s/events?after=minus-one",
        "/v1/sessions/s/events?after=9223372036854775808",
        "/v1/usage?since=9223372036854775808",
        "/v1/sessions?cursor=",
        "/v1/sessions?cursor=-5",
        "/v1/sessions?cursor=1234567890123456789",
        "/v1/sessions/s/events/stream?after=x",
    ] {
        assert_error(&api.get(path).await, StatusCode::BAD_REQUEST, "invalid_request");
    }
    let bad_resume = api
        .send(
            api.client
                .get(api.url("/v1/sessions/s/events/stream"))
                .header("last-event-id", "soon"),
        )
        .await;
    assert_error(&bad_resume, StatusCode::BAD_REQUEST, "invalid_request");
    // A resume point past the log's end was never seen by anyone: refused at
    // once instead of a stream that waits for nothing.
    let last = api.session("s").await["last_sequence"].as_u64().expect("last sequence");
    let beyond = api
        .get(&format!("/v1/sessions/s/events/stream?after={}", last + 1))
        .await;
    assert_error(&beyond, StatusCode::BAD_REQUEST, "invalid_request");
    assert!(
        beyond.body["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains(&format!("ends at {last}"))),
        "{}",
        beyond.body
    );
    let socket = format!(
        "{}/v1/sessions/s/ws?after={}",
        api.base.replacen("http", "ws", 1),
        last + 1000
    );
    match tokio_tungstenite::connect_async(socket).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), StatusCode::BAD_REQUEST.as_u16());
        }
        other => panic!("a WebSocket past the log's end must be refused, got {other:?}"),
    }
    let beyond = api
        .send(
            api.client
                .get(api.url("/v1/sessions/s/events/stream"))
                .header("last-event-id", (last + 1).to_string()),
        )
        .await;
    assert_error(&beyond, StatusCode::BAD_REQUEST, "invalid_request");
    let bad_key = api
        .send(
            api.client
                .post(api.url("/v1/sessions/s/submissions"))
                .header("idempotency-key", "k".repeat(129))
                .json(&json!({"op": {"type": "user_input", "text": "hi"}})),
        )
        .await;
    assert_error(&bad_key, StatusCode::BAD_REQUEST, "invalid_request");

    for path in [
        "/v1/sessions/nobody",
        "/v1/sessions/nobody/events",
        "/v1/sessions/nobody/events/stream",
        "/v1/nothing-here",
        "/nothing-here",
    ] {
        assert_error(&api.get(path).await, StatusCode::NOT_FOUND, "not_found");
    }
    assert_error(
        &api.submit("nobody", json!({"op": {"type": "user_input", "text": "hi"}}))
            .await,
        StatusCode::NOT_FOUND,
        "not_found",
    );
    // Deleting a session that does not exist is 404 (DELETE is a method
    // of this route since sessions can be deleted); PUT is not one.
    let delete_unknown = api.send(api.client.delete(api.url("/v1/sessions/nobody"))).await;
    assert_error(&delete_unknown, StatusCode::NOT_FOUND, "not_found");
    let wrong_method = api.send(api.client.put(api.url("/v1/sessions/s"))).await;
    assert_error(&wrong_method, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicts_and_a_full_queue_are_409() {
    let server = TestServer::start(|config, _| config.submission_capacity = 1).await;
    let model = server.scratch.script(
        "s.jsonl",
        &[&slow_chunks(50, 50), r#"{"text": "b"}"#, r#"{"text": "c"}"#],
    );
    server.api.create(json!({"id": "busy", "model": model})).await;
    let again = server
        .api
        .post("/v1/sessions", &json!({"id": "busy", "model": model}))
        .await;
    assert_error(&again, StatusCode::CONFLICT, "conflict");

    let mut stream = server.api.stream("busy", Resume::Start).await;
    server.api.say("busy", "first").await;
    stream
        .until(|event| event.msg.kind() == "assistant_content_delta")
        .await;
    // A turn runs; the queue holds one submission, the next is refused.
    let mut statuses = Vec::new();
    for text in ["second", "third", "fourth"] {
        let reply = server
            .api
            .submit("busy", json!({"op": {"type": "user_input", "text": text}}))
            .await;
        let full = reply.status == StatusCode::CONFLICT;
        statuses.push(reply);
        if full {
            break;
        }
    }
    let refused = statuses.last().expect("replies");
    assert_error(refused, StatusCode::CONFLICT, "queue_full");

    let rejected = server
        .api
        .submit(
            "busy",
            json!({"op": {"type": "user_input", "text": "now!"}, "on_busy": "reject"}),
        )
        .await;
    assert_error(&rejected, StatusCode::CONFLICT, "session_busy");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_and_messages_over_their_limits_are_413() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server.scratch.script("s.jsonl", &[r#"{"text": "Hi."}"#]);
    server.api.create(json!({"id": "big", "model": model})).await;
    // A body over the 2 MiB limit.
    let huge = "x".repeat(3 * 1024 * 1024);
    let reply = server
        .api
        .submit("big", json!({"op": {"type": "user_input", "text": huge}}))
        .await;
    assert_error(&reply, StatusCode::PAYLOAD_TOO_LARGE, "too_large");
    // A body within the limit whose message is over 1 MiB.
    let long = "x".repeat(MAX_MESSAGE_BYTES + 1);
    let reply = server
        .api
        .submit("big", json!({"op": {"type": "user_input", "text": long}}))
        .await;
    assert_error(&reply, StatusCode::PAYLOAD_TOO_LARGE, "too_large");
    // Nothing reached the log.
    let events = server.api.get("/v1/sessions/big/events").await;
    assert!(
        events.body["events"]
            .as_array()
            .expect("events")
            .iter()
            .all(|event| event["msg"]["type"] != "user_message"),
        "{}",
        events.body
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_room_for_another_live_session_is_503_too_many_sessions() {
    let server = TestServer::start(|config, _| config.max_live_sessions = 1).await;
    let slow = server.scratch.script("slow.jsonl", &[&slow_chunks(40, 50)]);
    let quick = server.scratch.script("quick.jsonl", &[r#"{"text": "Hi."}"#]);
    server.api.create(json!({"id": "running", "model": slow})).await;
    let mut stream = server.api.stream("running", Resume::Start).await;
    server.api.say("running", "go").await;
    stream
        .until(|event| event.msg.kind() == "assistant_content_delta")
        .await;
    // The only live session runs a turn: it cannot be unloaded.
    let reply = server
        .api
        .post("/v1/sessions", &json!({"id": "other", "model": quick}))
        .await;
    assert_error(&reply, StatusCode::SERVICE_UNAVAILABLE, "too_many_sessions");
    // Once it is idle, it makes room.
    stream.until(|event| event.msg.ends_turn()).await;
    server.api.wait_idle("running").await;
    drop(stream);
    // Room is made once the server has noticed the stream is gone.
    let created = wait_for_async("room for another session", HANG_GUARD, async || {
        let reply = server
            .api
            .post("/v1/sessions", &json!({"id": "other", "model": quick}))
            .await;
        if reply.status == StatusCode::CREATED {
            return Some(reply.body);
        }
        assert_error(&reply, StatusCode::SERVICE_UNAVAILABLE, "too_many_sessions");
        None
    })
    .await;
    assert_eq!(created["live"], true);
    assert_eq!(server.api.session("running").await["live"], false);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_arrives_while_the_server_shuts_down_is_503_unavailable() {
    let mut server = TestServer::start(|_, _| {}).await;
    let model = server.scratch.script("s.jsonl", &[r#"{"text": "Hi."}"#]);
    server.api.create(json!({"id": "late", "model": model})).await;
    // Send the head and half the body, shut down, then send the rest: the
    // request is in flight, so it is answered.
    let body = json!({"op": {"type": "user_input", "text": "hello"}}).to_string();
    let (first, rest) = body.split_at(10);
    let address = server.api.base.trim_start_matches("http://").to_owned();
    let mut socket = tokio::net::TcpStream::connect(&address).await.expect("connect");
    let head = format!(
        "POST /v1/sessions/late/submissions HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{first}",
        body.len()
    );
    socket.write_all(head.as_bytes()).await.expect("send the head");
    let server_port = socket.peer_addr().expect("server address").port();
    let client_port = socket.local_addr().expect("client address").port();
    wait_until("the server to read the head", HANG_GUARD, || {
        unread_by_server(server_port, Some(client_port)) == Some(0)
    });
    let stopping = server.begin_stop();
    // Closing shows on `/readyz` (503), then the listener goes (refused).
    let readyz = server.api.url("/readyz");
    wait_until_async("the server to begin its shutdown", HANG_GUARD, async || {
        reqwest::get(&readyz)
            .await
            .map_or(true, |reply| reply.status() == StatusCode::SERVICE_UNAVAILABLE)
    })
    .await;
    socket.write_all(rest.as_bytes()).await.expect("send the rest");
    let mut response = Vec::new();
    guard("the response", socket.read_to_end(&mut response))
        .await
        .expect("read the response");
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 503"), "{response}");
    let json = response.split("\r\n\r\n").nth(1).expect("a body");
    let body: Value = serde_json::from_str(json).expect("JSON");
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    guard("the server to stop", stopping)
        .await
        .expect("task")
        .expect("stopped cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_inside_an_op_are_400_and_a_long_steer_413() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server.scratch.script("s.jsonl", &[r#"{"text": "Hi."}"#]);
    server.api.create(json!({"id": "s", "model": model})).await;
    let api = &server.api;
    for body in [
        json!({"op": {"type": "user_input", "text": "hi", "txet": "typo"}}),
        json!({"op": {"type": "steer", "text": "hi", "urgent": true}}),
        json!({"op": {"type": "interrupt", "turn": "t1"}}),
        json!({"op": {"type": "shutdown", "now": true}}),
        json!({"op": {"type": "approval", "call_id": "c", "decision": "deny", "why": "no"}}),
    ] {
        let reply = api.submit("s", body.clone()).await;
        assert_error(&reply, StatusCode::BAD_REQUEST, "invalid_request");
    }
    // A steer is a message: over 1 MiB it is too large, like `user_input`.
    let long = "x".repeat(MAX_MESSAGE_BYTES + 1);
    let reply = api.submit("s", json!({"op": {"type": "steer", "text": long}})).await;
    assert_error(&reply, StatusCode::PAYLOAD_TOO_LARGE, "too_large");
    let events = api.get("/v1/sessions/s/events").await;
    assert!(
        events.body["events"]
            .as_array()
            .expect("events")
            .iter()
            .all(|event| event["msg"]["type"] != "submission_queued"),
        "nothing was queued: {}",
        events.body
    );
    server.stop().await;
}

/// A body over the limit (but not wildly) is read to its end before the
/// `413`: a client that writes its whole body before reading (as most
/// do) must get to read the answer, not a broken pipe. Here the answer
/// may not come while the body is still being written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_read_to_its_end_before_its_413() {
    let server = TestServer::start(|_, _| {}).await;
    let address = server
        .api
        .url("")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let length = 3 * 1024 * 1024;
    let mut socket = tokio::net::TcpStream::connect(&address).await.expect("connect");
    let head = format!(
        "POST /v1/sessions/big/submissions HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n"
    );
    socket.write_all(head.as_bytes()).await.expect("write the head");
    socket.write_all(&[b'x'; 1024]).await.expect("write some of the body");
    let mut answer = Vec::new();
    let early = tokio::time::timeout(Duration::from_millis(300), socket.read_buf(&mut answer)).await;
    assert!(
        early.is_err(),
        "answered before the body was written: {:?}",
        String::from_utf8_lossy(&answer)
    );
    socket
        .write_all(&vec![b'x'; length - 1024])
        .await
        .expect("the whole body is taken");
    guard("the answer", socket.read_to_end(&mut answer))
        .await
        .expect("read the answer");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("too_large"), "{answer}");
    server.stop().await;
}
