//! deploy/nginx.conf's location block in front of a real `keel serve`: the
//! API answers through it for the public host name, an event stream comes
//! through as it is written, and a WebSocket upgrades and carries ops and
//! events. TLS is left out (the test's nginx listens in plain HTTP); the
//! block's settings are used as they are.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::suite::support::api::SseStream;
use crate::suite::support::server::{Scratch, ServeProcess, free_port, slow_chunks};
use crate::suite::support::wait::guard;

const HOST: &str = "keel.example.com";

/// nginx running the example in front of `keel` (`host:port`), on `port`.
struct Nginx {
    child: Child,
    _prefix: tempfile::TempDir,
}

impl Nginx {
    fn start(nginx: &std::path::Path, keel: &str, port: u16) -> Self {
        let prefix = tempfile::tempdir().expect("nginx prefix");
        let dir = prefix.path().to_str().expect("utf-8").to_owned();
        let example = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/nginx.conf"))
            .expect("deploy/nginx.conf");
        let site: String = example
            .lines()
            .filter(|line| {
                let line = line.trim();
                !(line.starts_with("listen [::]") || line.starts_with("ssl_certificate"))
            })
            .map(|line| {
                line.replace("listen 443 ssl http2;", &format!("listen 127.0.0.1:{port};"))
                    .replace("listen 80;", &format!("listen 127.0.0.1:{};", free_port()))
                    .replace("server 127.0.0.1:7777;", &format!("server {keel};"))
                    .replace("/var/log/nginx/", &format!("{dir}/"))
            })
            .map(|line| line + "\n")
            .collect();
        assert!(
            site.contains(&format!("listen 127.0.0.1:{port};")),
            "the example's TLS listener"
        );
        std::fs::write(prefix.path().join("keel.conf"), site).expect("site");
        let temp: String = ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"]
            .iter()
            .map(|kind| format!("{kind}_temp_path {dir}/{kind};\n"))
            .collect();
        let main = format!(
            "daemon off;\nmaster_process off;\npid {dir}/nginx.pid;\nerror_log {dir}/error.log;\nevents {{}}\n\
             http {{\naccess_log off;\n{temp}include {dir}/keel.conf;\n}}\n"
        );
        std::fs::write(prefix.path().join("nginx.conf"), main).expect("main config");
        std::fs::create_dir(prefix.path().join("logs")).expect("logs");
        let child = Command::new(nginx)
            .args(["-p", &dir, "-c"])
            .arg(prefix.path().join("nginx.conf"))
            .stdin(Stdio::null())
            .spawn()
            .expect("start nginx");
        let proxy = Self { child, _prefix: prefix };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "nginx did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        proxy
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nginx_example_carries_the_api_an_event_stream_and_a_websocket() {
    let Some(nginx) = super::deploy::checker(
        "the_nginx_example_carries_the_api_an_event_stream_and_a_websocket",
        "nginx",
    ) else {
        return;
    };
    let scratch = Scratch::new();
    let slow = scratch.script("slow.jsonl", &[&slow_chunks(40, 50), r#"{"text": "Over the socket."}"#]);
    let server = ServeProcess::start(&scratch, &["--allow-host", HOST, "--model", &slow]);
    let keel = server.api.base.trim_start_matches("http://").to_owned();
    let port = free_port();
    let _proxy = Nginx::start(&nginx, &keel, port);

    // Clients use the public name; it resolves to the proxy.
    let address: SocketAddr = ([127, 0, 0, 1], port).into();
    let client = reqwest::Client::builder()
        .resolve(HOST, address)
        .build()
        .expect("client");
    let base = format!("http://{HOST}:{port}");
    let health = client
        .get(format!("{base}/readyz"))
        .send()
        .await
        .expect("through nginx");
    assert_eq!(health.status(), StatusCode::OK);
    let created = client
        .post(format!("{base}/v1/sessions"))
        .json(&json!({"id": "proxied"}))
        .send()
        .await
        .expect("create");
    assert_eq!(created.status(), StatusCode::CREATED);

    // The stream delivers the first chunk while the turn still runs.
    let stream = client
        .get(format!("{base}/v1/sessions/proxied/events/stream"))
        .header("accept", "text/event-stream")
        .send()
        .await
        .expect("stream");
    assert_eq!(stream.status(), StatusCode::OK);
    let mut stream = SseStream::new(stream);
    let accepted = client
        .post(format!("{base}/v1/sessions/proxied/submissions"))
        .json(&json!({"op": {"type": "user_input", "text": "Stream it"}}))
        .send()
        .await
        .expect("submit");
    assert_eq!(accepted.status(), StatusCode::ACCEPTED);
    stream
        .until(|event| matches!(event.msg, keel::protocol::EventMsg::AssistantContentDelta(_)))
        .await;
    assert_eq!(
        server.api.session("proxied").await["state"],
        "running",
        "a chunk came through before the turn ended"
    );
    server.api.wait_idle("proxied").await;

    // A WebSocket upgrades through the proxy and carries an op and its events.
    let tcp = tokio::net::TcpStream::connect(address).await.expect("connect to nginx");
    let url = format!("ws://{HOST}:{port}/v1/sessions/proxied/ws?after=0");
    let (mut socket, _) = guard("WebSocket through nginx", tokio_tungstenite::client_async(url, tcp))
        .await
        .expect("the upgrade passes through");
    let op = json!({"op": {"type": "user_input", "text": "Over the socket"}, "request_id": "r1"});
    socket.send(Message::text(op.to_string())).await.expect("send");
    let mut answered = false;
    loop {
        let frame = guard("a frame", socket.next()).await.expect("open").expect("frame");
        let Message::Text(text) = frame else { continue };
        let frame: Value = serde_json::from_str(&text).expect("JSON");
        answered |= frame["type"] == "submission_accepted" && frame["request_id"] == "r1";
        if frame["msg"]["type"] == "assistant_message" && frame["msg"]["text"] == "Over the socket." {
            break;
        }
    }
    assert!(answered, "the op was accepted over the socket");
    let (status, lines) = server.terminate();
    assert!(status.success(), "{lines:?}");
}
