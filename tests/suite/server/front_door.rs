//! The front door: what a web page of another site, a rebound DNS name, a
//! flood of idle or slow connections and an over-sized request can make
//! the server do (nothing), over real HTTP on loopback.

use std::process::Command;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::suite::support::api::{Reply, Resume};
use crate::suite::support::server::{Scratch, ServeProcess, TestServer, unread_by_server};
use crate::suite::support::wait::{HANG_GUARD, guard, wait_until_async};

/// Far longer than any timeout under test: reaching it is a failure, not a
/// measurement.
pub(super) const BOUND: Duration = Duration::from_secs(30);

fn assert_error(reply: &Reply, status: StatusCode, code: &str) {
    assert_eq!((reply.status, reply.code()), (status, code), "{}", reply.body);
}

/// The `host:port` of a server's base URL.
pub(super) fn address(base: &str) -> String {
    base.trim_start_matches("http://").to_owned()
}

/// Sends raw bytes on a new connection and reads until the server closes
/// it (or [`BOUND`] passes, which fails the test).
pub(super) async fn exchange(address: &str, bytes: &[u8]) -> String {
    let mut socket = TcpStream::connect(address).await.expect("connect");
    socket.write_all(bytes).await.expect("send");
    let mut response = Vec::new();
    tokio::time::timeout(BOUND, socket.read_to_end(&mut response))
        .await
        .expect("the server answered and closed the connection")
        .expect("read");
    String::from_utf8_lossy(&response).into_owned()
}

/// The JSON error body of a raw response.
pub(super) fn raw_error_code(response: &str) -> String {
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    let body: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    body["error"]["code"].as_str().unwrap_or_default().to_owned()
}

/// Waits until the peer closes `socket` (EOF or reset); fails the test
/// after [`BOUND`]. Returns how long it took.
pub(super) async fn closed_by_server(socket: &mut TcpStream) -> Duration {
    let start = Instant::now();
    let mut sink = [0u8; 4096];
    tokio::time::timeout(BOUND, async {
        loop {
            match socket.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .expect("the server closed the connection");
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_another_site_cannot_create_a_session() {
    // With a default model, as the finding ran it, `{"id":"x"}` alone
    // would create a session.
    let server = TestServer::start(|config, scratch| {
        config.default_model = Some(scratch.script("default.jsonl", &[r#"{"text": "Hi."}"#]));
    })
    .await;
    let api = &server.api;
    let own = format!("http://{}", address(&api.base));

    // The reproduction: `curl -H 'Origin: http://evil.example' -H
    // 'Content-Type: text/plain' -d '{"id":"x"}' …/v1/sessions`.
    let evil = api
        .send(
            api.client
                .post(api.url("/v1/sessions"))
                .header("origin", "http://evil.example")
                .header("content-type", "text/plain")
                .body(r#"{"id":"x"}"#),
        )
        .await;
    assert_error(&evil, StatusCode::FORBIDDEN, "forbidden_origin");
    // Even as JSON, from another origin, from an opaque one, or marked
    // cross-site by the browser without an Origin.
    for (name, value) in [
        ("origin", "http://evil.example"),
        ("origin", "null"),
        ("origin", "http://127.0.0.1:1"),
        ("sec-fetch-site", "cross-site"),
        ("sec-fetch-site", "same-site"),
    ] {
        let refused = api
            .send(
                api.client
                    .post(api.url("/v1/sessions"))
                    .header(name, value)
                    .json(&json!({"id": "x"})),
            )
            .await;
        assert_error(&refused, StatusCode::FORBIDDEN, "forbidden_origin");
    }
    // A CORS preflight from another origin, and a read.
    let preflight = api
        .send(
            api.client
                .request(reqwest::Method::OPTIONS, api.url("/v1/sessions"))
                .header("origin", "http://evil.example")
                .header("access-control-request-method", "POST"),
        )
        .await;
    assert_error(&preflight, StatusCode::FORBIDDEN, "forbidden_origin");
    let read = api
        .send(
            api.client
                .get(api.url("/v1/sessions"))
                .header("origin", "http://evil.example"),
        )
        .await;
    assert_error(&read, StatusCode::FORBIDDEN, "forbidden_origin");
    // Without any Origin, a body that is not declared JSON is refused too:
    // it is what a cross-site form or `text/plain` fetch would send.
    for content_type in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"] {
        let untyped = api
            .send(
                api.client
                    .post(api.url("/v1/sessions"))
                    .header("content-type", content_type)
                    .body(r#"{"id":"x"}"#),
            )
            .await;
        assert_error(&untyped, StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type");
    }
    let no_type = api
        .send(api.client.post(api.url("/v1/sessions")).body(r#"{"id":"x"}"#))
        .await;
    assert_error(&no_type, StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type");
    assert_error(&api.get("/v1/sessions/x").await, StatusCode::NOT_FOUND, "not_found");
    assert_eq!(api.get("/v1/sessions").await.body["sessions"], json!([]));
    // The operator sees the pages knocking: 8 refused by origin above.
    let metrics = api.metrics().await;
    assert!(
        metrics.contains(r#"keel_http_requests_total{route="refused",status="403"} 8"#),
        "{metrics}"
    );

    // The server's own page (same origin) still works, and a top-level
    // navigation from another site still opens the UI.
    let own_page = api
        .send(
            api.client
                .post(api.url("/v1/sessions"))
                .header("origin", &own)
                .header("sec-fetch-site", "same-origin")
                .json(&json!({"id": "mine"})),
        )
        .await;
    assert_eq!(own_page.status, StatusCode::CREATED, "{}", own_page.body);
    let typed = api
        .send(
            api.client
                .post(api.url("/v1/sessions"))
                .header("content-type", "application/json; charset=utf-8")
                .body(r#"{"id": "typed"}"#),
        )
        .await;
    assert_eq!(typed.status, StatusCode::CREATED, "{}", typed.body);
    let navigation = api
        .client
        .get(api.url("/"))
        .header("sec-fetch-site", "cross-site")
        .header("sec-fetch-mode", "navigate")
        .send()
        .await
        .expect("navigate");
    assert_eq!(navigation.status(), StatusCode::OK);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configured_cors_origin_is_let_in_and_no_other() {
    let server = TestServer::start(|config, scratch| {
        config.cors_origin = Some("https://app.example".to_owned());
        config.default_model = Some(scratch.script("default.jsonl", &[r#"{"text": "Hi."}"#]));
    })
    .await;
    let api = &server.api;
    let allowed = api
        .send(
            api.client
                .post(api.url("/v1/sessions"))
                .header("origin", "https://app.example")
                .header("sec-fetch-site", "cross-site")
                .json(&json!({"id": "cors"})),
        )
        .await;
    assert_eq!(allowed.status, StatusCode::CREATED, "{}", allowed.body);
    let other = api
        .send(
            api.client
                .request(reqwest::Method::OPTIONS, api.url("/v1/sessions"))
                .header("origin", "https://evil.example")
                .header("access-control-request-method", "POST"),
        )
        .await;
    assert_error(&other, StatusCode::FORBIDDEN, "forbidden_origin");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebound_or_missing_host_is_421() {
    let server = TestServer::start(|config, _| config.allowed_hosts = vec!["keel.internal".to_owned()]).await;
    let api = &server.api;
    let port = address(&api.base).rsplit_once(':').expect("port").1.to_owned();

    // DNS rebinding: the page's own name now resolves to 127.0.0.1.
    for host in [
        format!("rebind.example:{port}"),
        "127.0.0.2".to_owned(),
        "localhost.evil.example".to_owned(),
    ] {
        let rebound = api
            .send(api.client.get(api.url("/v1/sessions")).header("host", &host))
            .await;
        assert_error(&rebound, StatusCode::MISDIRECTED_REQUEST, "misdirected_request");
        let create = api
            .send(
                api.client
                    .post(api.url("/v1/sessions"))
                    .header("host", &host)
                    .json(&json!({"id": "x"})),
            )
            .await;
        assert_error(&create, StatusCode::MISDIRECTED_REQUEST, "misdirected_request");
        let page = api
            .client
            .get(api.url("/"))
            .header("host", &host)
            .send()
            .await
            .expect("UI");
        assert_eq!(page.status(), StatusCode::MISDIRECTED_REQUEST);
    }
    // No Host at all (HTTP/1.0 allows it).
    let hostless = exchange(&address(&api.base), b"GET /v1/sessions HTTP/1.0\r\n\r\n").await;
    assert!(
        hostless.starts_with("HTTP/1.0 421") || hostless.starts_with("HTTP/1.1 421"),
        "{hostless}"
    );
    assert_eq!(raw_error_code(&hostless), "misdirected_request");
    assert_error(&api.get("/v1/sessions/x").await, StatusCode::NOT_FOUND, "not_found");

    // The names the server answers for, on any port.
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "[::1]:80".to_owned(),
        "KEEL.internal:8443".to_owned(),
    ] {
        let answered = api
            .send(api.client.get(api.url("/v1/sessions")).header("host", &host))
            .await;
        assert_eq!(answered.status, StatusCode::OK, "{host}: {}", answered.body);
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_from_another_origin_is_refused() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server.scratch.script("s.jsonl", &[r#"{"text": "Hi."}"#]);
    server.api.create(json!({"id": "s", "model": model})).await;
    let url = format!("{}/v1/sessions/s/ws", server.api.base.replacen("http", "ws", 1));

    for origin in ["http://evil.example", "null"] {
        let mut request = url.as_str().into_client_request().expect("request");
        request.headers_mut().insert("origin", origin.parse().expect("origin"));
        match guard("a cross-origin upgrade", tokio_tungstenite::connect_async(request)).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                assert_eq!(response.status(), StatusCode::FORBIDDEN, "{origin}");
            }
            Err(other) => panic!("{origin}: unexpected failure {other}"),
            Ok(_) => panic!("{origin}: a cross-origin WebSocket was accepted"),
        }
    }
    // The UI's own origin is let in.
    let mut request = url.as_str().into_client_request().expect("request");
    let own = format!("http://{}", address(&server.api.base));
    request.headers_mut().insert("origin", own.parse().expect("origin"));
    let (socket, _) = guard("a same-origin upgrade", tokio_tungstenite::connect_async(request))
        .await
        .expect("same-origin WebSocket");
    drop(socket);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_query_token_is_taken_only_on_the_stream_and_websocket_routes() {
    let mut server = TestServer::start(|config, _| config.token = Some("s3cret".to_owned())).await;
    let model = server.scratch.script("s.jsonl", &[r#"{"text": "Hi."}"#]);
    server.api.token = Some("s3cret".to_owned());
    // A session named like the WebSocket route's last segment.
    server.api.create(json!({"id": "ws", "model": model})).await;
    let api = &server.api;
    let anonymous = reqwest::Client::new();

    let by_suffix = anonymous
        .get(api.url("/v1/sessions/ws?access_token=s3cret"))
        .send()
        .await
        .expect("request");
    assert_eq!(by_suffix.status(), StatusCode::UNAUTHORIZED);
    for path in [
        "/v1/sessions?access_token=s3cret",
        "/v1/sessions/ws/events?access_token=s3cret",
    ] {
        let refused = anonymous.get(api.url(path)).send().await.expect("request");
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
    let stream = anonymous
        .get(api.url("/v1/sessions/ws/events/stream?access_token=s3cret"))
        .send()
        .await
        .expect("stream");
    assert_eq!(stream.status(), StatusCode::OK);
    drop(stream);
    let ws_url = format!(
        "{}/v1/sessions/ws/ws?access_token=s3cret",
        api.base.replacen("http", "ws", 1)
    );
    let (socket, _) = guard("WebSocket", tokio_tungstenite::connect_async(ws_url))
        .await
        .expect("a WebSocket with a query token");
    drop(socket);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_over_limit_content_length_is_413_before_the_body_is_sent() {
    let server = TestServer::start(|config, _| config.body_limit = 64 * 1024).await;
    let model = server.scratch.script("s.jsonl", &[r#"{"text": "Hi."}"#]);
    server.api.create(json!({"id": "s", "model": model})).await;
    let address = address(&server.api.base);
    for path in ["/v1/sessions", "/v1/sessions/s/submissions", "/healthz"] {
        // The head only: the declared body never comes.
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n",
            10 * 1024 * 1024
        );
        let response = exchange(&address, head.as_bytes()).await;
        assert!(response.starts_with("HTTP/1.1 413"), "{path}: {response}");
        assert_eq!(raw_error_code(&response), "too_large", "{path}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_request_head_is_cut_off_after_the_header_timeout() {
    let server = TestServer::start(|config, _| config.header_timeout = Duration::from_secs(1)).await;
    let address = address(&server.api.base);

    // Half a head, then nothing.
    let mut half = TcpStream::connect(&address).await.expect("connect");
    half.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {address}\r\nX-Slow: ").as_bytes())
        .await
        .expect("send");
    closed_by_server(&mut half).await;

    // A head trickled a byte at a time (slowloris): each byte arrives well
    // within the timeout, the whole head never does.
    let mut trickle = TcpStream::connect(&address).await.expect("connect");
    trickle
        .write_all(format!("GET /healthz HTTP/1.1\r\nHost: {address}\r\n").as_bytes())
        .await
        .expect("send");
    let started = Instant::now();
    loop {
        assert!(started.elapsed() < BOUND, "the trickling connection was never cut");
        if trickle.write_all(b"X").await.is_err() {
            break;
        }
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_millis(200), trickle.read(&mut byte)).await;
        if let Ok(Ok(0) | Err(_)) = read {
            break;
        }
    }

    // A connection that sends nothing at all.
    let mut silent = TcpStream::connect(&address).await.expect("connect");
    closed_by_server(&mut silent).await;
    // And the server still answers.
    assert_eq!(server.api.get("/healthz").await.status, StatusCode::OK);
    server.stop().await;
}

/// A connection that made one request (its response read) and is kept
/// alive, idle from now on.
async fn kept_alive(address: &str) -> TcpStream {
    let mut kept = TcpStream::connect(address).await.expect("connect");
    kept.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {address}\r\n\r\n").as_bytes())
        .await
        .expect("send");
    let mut head = Vec::new();
    while !head.windows(4).any(|window| window == b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        guard("the response", kept.read_exact(&mut byte)).await.expect("read");
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
    kept
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_kept_alive_connection_is_closed_but_streams_are_not() {
    let server = TestServer::start(|config, _| config.header_timeout = Duration::from_secs(1)).await;
    // The server closes idle kept-alive connections after a second: a
    // client that pooled one could send on it just as it closes (the race
    // every HTTP client has with idle timeouts), so this one keeps none.
    let mut api = server.api.clone();
    api.client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    let address = address(&api.base);
    let model = server
        .scratch
        .script("s.jsonl", &[r#"{"text": "one"}"#, r#"{"text": "two"}"#]);
    api.create(json!({"id": "s", "model": model})).await;

    // One request on a kept-alive connection, then silence.
    let mut kept = kept_alive(&address).await;
    closed_by_server(&mut kept).await;

    // An event stream and a WebSocket outlive the timeout: they are inside
    // a request, or upgraded.
    let mut stream = api.stream("s", Resume::Start).await;
    let ws_url = format!("{}/v1/sessions/s/ws", api.base.replacen("http", "ws", 1));
    let (mut socket, _) = guard("WebSocket", tokio_tungstenite::connect_async(ws_url))
        .await
        .expect("WebSocket");
    // Until the timeout has passed since: a connection kept alive from now
    // on is closed for it.
    closed_by_server(&mut kept_alive(&address).await).await;
    api.say("s", "hello").await;
    let events = stream.turns(1).await;
    assert_eq!(events.last().map(|event| event.msg.kind()), Some("turn_complete"));
    // And again, the stream and the socket idle since the turn ended.
    closed_by_server(&mut kept_alive(&address).await).await;
    socket
        .send(Message::text(
            json!({"op": {"type": "user_input", "text": "again"}, "request_id": "r"}).to_string(),
        ))
        .await
        .expect("send a frame");
    let reply = guard("the WebSocket reply", async {
        loop {
            let message = socket.next().await.expect("open").expect("frame");
            if let Message::Text(text) = message {
                let value: Value = serde_json::from_str(text.as_str()).expect("JSON");
                if value["type"] == "submission_accepted" {
                    return value;
                }
            }
        }
    })
    .await;
    assert_eq!(reply["request_id"], "r");
    server.stop().await;
}

/// `keel serve` started as the finding ran it: with the usual soft limit
/// of 1024 open files.
fn serve_with_small_file_limit(scratch: &Scratch, args: &[&str]) -> ServeProcess {
    let plain = ServeProcess::command(scratch, args);
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(r#"ulimit -Sn 1024 && exec "$0" "$@""#)
        .arg(plain.get_program())
        .args(plain.get_args());
    for (key, value) in plain.get_envs() {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
    if let Some(dir) = plain.get_current_dir() {
        command.current_dir(dir);
    }
    ServeProcess::spawn(command)
}

#[test]
fn over_a_thousand_idle_connections_leave_room_for_a_real_request() {
    // This process holds the client ends.
    keel::server::raise_open_file_limit();
    let scratch = Scratch::new();
    let process = serve_with_small_file_limit(&scratch, &["--max-connections", "2048"]);
    let api = process.api.clone();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let address = address(&api.base);
        let mut idle = Vec::new();
        for _ in 0..1100 {
            idle.push(TcpStream::connect(&address).await.expect("connect"));
        }
        // Until the server has accepted them all.
        let pid = process.pid();
        wait_until_async("the server to accept 1,100 connections", HANG_GUARD, async || {
            open_sockets(pid) >= 1100
        })
        .await;
        let answered = tokio::time::timeout(BOUND, api.client.get(api.url("/v1/sessions")).send())
            .await
            .expect("a request among 1,100 idle connections is answered")
            .expect("request");
        assert_eq!(answered.status(), StatusCode::OK);
        drop(idle);
    });
}

/// How many sockets process `pid` has open.
fn open_sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("/proc fd")
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

/// The resident memory of a process, in KiB.
pub(super) fn resident_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[test]
fn hundreds_of_half_sent_large_headers_keep_memory_bounded() {
    keel::server::raise_open_file_limit();
    let scratch = Scratch::new();
    let process = ServeProcess::start(&scratch, &[]);
    let api = process.api.clone();
    let pid = process.pid();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        assert_eq!(api.get("/healthz").await.status, StatusCode::OK);
        let before = resident_kib(pid);
        let address = address(&api.base);
        let filler = "a".repeat(380 * 1024);
        let mut senders = Vec::new();
        for _ in 0..500 {
            let head = format!("GET /healthz HTTP/1.1\r\nHost: {address}\r\nX-Filler: {filler}");
            let address = address.clone();
            senders.push(tokio::spawn(async move {
                let mut socket = TcpStream::connect(&address).await.expect("connect");
                // The server may cut the connection part-way: that is the point.
                let _ = tokio::time::timeout(BOUND, socket.write_all(head.as_bytes())).await;
                socket
            }));
        }
        let mut sockets = Vec::new();
        for sender in senders {
            sockets.push(sender.await.expect("sender"));
        }
        // Until the server has taken in (or refused) every byte sent.
        let port = api
            .base
            .rsplit(':')
            .next()
            .and_then(|port| port.parse().ok())
            .expect("port");
        wait_until_async("the server to read what it was sent", HANG_GUARD, async || {
            unread_by_server(port, None).is_none_or(|unread| unread == 0)
        })
        .await;
        let after = resident_kib(pid);
        let grown_mib = after.saturating_sub(before) / 1024;
        assert!(
            grown_mib < 64,
            "500 half-sent 380 KiB heads grew the server from {before} KiB to {after} KiB"
        );
        assert_eq!(api.get("/healthz").await.status, StatusCode::OK);
        drop(sockets);
    });
}
