//! How a request is framed at the front door: one `Host`, one body length,
//! and a body that arrives within its timeout. Over raw TCP on loopback,
//! against the in-process server.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::front_door::{BOUND, address, closed_by_server, exchange, raw_error_code};
use crate::suite::support::server::TestServer;

/// RFC 9112 §3.2: a request with more than one `Host` is answered `400`,
/// whichever of them names the server; so is one whose `Content-Length`s
/// disagree (where its body ends would be a guess).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_or_disagreeing_lengths_are_400() {
    let server = TestServer::start(|_, _| {}).await;
    let address = address(&server.api.base);
    for hosts in [
        format!("Host: {address}\r\nHost: {address}\r\n"),
        format!("Host: {address}\r\nHost: evil.example\r\n"),
        format!("Host: evil.example\r\nHost: {address}\r\n"),
    ] {
        let request = format!("GET /v1/sessions HTTP/1.1\r\n{hosts}Connection: close\r\n\r\n");
        let response = exchange(&address, request.as_bytes()).await;
        assert!(response.starts_with("HTTP/1.1 400"), "{hosts:?}: {response}");
    }
    let body = r#"{"id": "framed"}"#;
    let request = format!(
        "POST /v1/sessions HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nContent-Length: 3\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let response = exchange(&address, request.as_bytes()).await;
    assert!(response.starts_with("HTTP/1.1 400"), "{response}");
    // One Host, as always, is answered.
    let request = format!("GET /healthz HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    assert!(exchange(&address, request.as_bytes()).await.starts_with("HTTP/1.1 200"));
    assert_eq!(
        server.api.get("/v1/sessions/framed").await.status,
        StatusCode::NOT_FOUND
    );
    server.stop().await;
}

/// The finding: connections each sending all but the last byte of a
/// declared 2 MiB body held their buffers and stayed open. Each is now
/// answered `408` once the body timeout passes, and closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_is_408_and_its_connection_closed() {
    let server = TestServer::start(|config, _| config.body_timeout = Duration::from_secs(1)).await;
    let address = address(&server.api.base);
    let limit = keel::server::DEFAULT_BODY_LIMIT;
    let almost = vec![b' '; limit - 1];
    let mut stalled = Vec::new();
    for _ in 0..20 {
        let mut socket = TcpStream::connect(&address).await.expect("connect");
        let head = format!(
            "POST /v1/sessions HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
             Content-Length: {limit}\r\n\r\n"
        );
        socket.write_all(head.as_bytes()).await.expect("head");
        socket.write_all(&almost).await.expect("all but one byte");
        stalled.push(socket);
    }
    for socket in &mut stalled {
        let mut response = Vec::new();
        let read = tokio::time::timeout(BOUND, tokio::io::AsyncReadExt::read_to_end(socket, &mut response))
            .await
            .expect("the server closed the stalled connection");
        let response = String::from_utf8_lossy(&response);
        assert!(read.is_ok(), "read: {read:?}");
        assert!(response.starts_with("HTTP/1.1 408"), "{response}");
        assert_eq!(raw_error_code(&response), "request_timeout");
    }
    // A body that stops without a word is cut the same way.
    let mut silent = TcpStream::connect(&address).await.expect("connect");
    silent
        .write_all(
            format!(
                "POST /v1/sessions HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
                 Content-Length: 100\r\n\r\n{{\"id\""
            )
            .as_bytes(),
        )
        .await
        .expect("send");
    closed_by_server(&mut silent).await;
    // And the server still takes a body sent in full.
    let model = server.scratch.script("s.jsonl", &[r#"{"text": "Hi."}"#]);
    let reply = server
        .api
        .post("/v1/sessions", &json!({"id": "whole", "model": model}))
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
    assert_eq!(server.api.get("/healthz").await.status, StatusCode::OK);
    server.stop().await;
}
