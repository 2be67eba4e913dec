//! A scripted HTTP/1.1 server on loopback, for testing model providers over
//! real HTTP with byte-exact control of what they receive: status, headers,
//! body pieces split anywhere, pauses, a stall, an abrupt close.

#![allow(dead_code)] // Each provider test module uses part of it.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::wait::{HANG_GUARD, wait_until_async};

/// One piece of a scripted response body.
#[derive(Debug, Clone)]
pub(crate) enum Part {
    /// Bytes sent as one chunk (and flushed).
    Bytes(Vec<u8>),
    /// A pause before the next part.
    Pause(Duration),
    /// Send nothing more, but keep the connection open (until the client
    /// goes away).
    Stall,
    /// Drop the connection without finishing the body.
    Cut,
}

/// A scripted response.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    parts: Vec<Part>,
}

impl Reply {
    /// A `200 text/event-stream` response whose body is `parts`.
    pub(crate) fn sse(parts: Vec<Part>) -> Self {
        Self {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            parts,
        }
    }

    /// A `200 text/event-stream` response of `body`, sent in pieces of
    /// `piece` bytes with no pause (so splits fall anywhere: mid-line, mid
    /// UTF-8 character, between CR and LF).
    pub(crate) fn sse_in_pieces(body: &[u8], piece: usize) -> Self {
        Self::sse(
            body.chunks(piece.max(1))
                .map(|chunk| Part::Bytes(chunk.to_vec()))
                .collect(),
        )
    }

    /// A response with `status` and a JSON body.
    pub(crate) fn json(status: u16, body: &str) -> Self {
        Self {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            parts: vec![Part::Bytes(body.as_bytes().to_vec())],
        }
    }

    /// A response with `status`, `content_type` and `body`.
    pub(crate) fn typed(status: u16, content_type: &str, body: &str) -> Self {
        Self {
            status,
            headers: vec![("content-type".into(), content_type.into())],
            parts: vec![Part::Bytes(body.as_bytes().to_vec())],
        }
    }

    /// This response with an extra header.
    pub(crate) fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }
}

/// A request the server received.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub(crate) method: String,
    pub(crate) path: String,
    /// Header names in lower case.
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl Request {
    /// The value of header `name` (lower case).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    /// The body as JSON.
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("the request body is JSON")
    }
}

#[derive(Default)]
struct Shared {
    replies: Vec<Reply>,
    requests: Vec<Request>,
    /// Connections the client closed while the server was still sending.
    abandoned: usize,
}

/// The server; it stops when dropped.
pub(crate) struct ScriptedServer {
    address: std::net::SocketAddr,
    shared: Arc<Mutex<Shared>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ScriptedServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ScriptedServer {
    /// Starts a server that answers the n-th request with `replies[n]` (and
    /// any request beyond them with a 500).
    pub(crate) async fn start(replies: Vec<Reply>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
        let address = listener.local_addr().expect("address");
        let shared = Arc::new(Mutex::new(Shared {
            replies: replies.into_iter().rev().collect(),
            ..Shared::default()
        }));
        let task = tokio::spawn({
            let shared = Arc::clone(&shared);
            async move {
                while let Ok((socket, _)) = listener.accept().await {
                    tokio::spawn(serve(socket, Arc::clone(&shared)));
                }
            }
        });
        Self { address, shared, task }
    }

    /// The base URL, `http://127.0.0.1:PORT`.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Every request received so far, in order.
    pub(crate) fn requests(&self) -> Vec<Request> {
        self.shared.lock().expect("server state").requests.clone()
    }

    /// How many responses the client abandoned before they were complete
    /// (for example because the request was cancelled).
    pub(crate) fn abandoned(&self) -> usize {
        self.shared.lock().expect("server state").abandoned
    }

    /// Waits until the client has abandoned `count` responses.
    pub(crate) async fn wait_abandoned(&self, count: usize) {
        let what = format!("the client to abandon {count} responses");
        wait_until_async(&what, HANG_GUARD, async || self.abandoned() >= count).await;
    }
}

async fn serve(mut socket: TcpStream, shared: Arc<Mutex<Shared>>) {
    let Some(request) = read_request(&mut socket).await else {
        return;
    };
    let reply = {
        let mut shared = shared.lock().expect("server state");
        shared.requests.push(request);
        shared.replies.pop()
    };
    let reply = reply.unwrap_or_else(|| Reply::json(500, r#"{"error": {"message": "unexpected request"}}"#));
    let complete = send(&mut socket, &reply).await;
    if !complete {
        shared.lock().expect("server state").abandoned += 1;
    }
}

/// Reads one request (head and `Content-Length` body).
async fn read_request(socket: &mut TcpStream) -> Option<Request> {
    let mut buffer = Vec::new();
    let head_end = loop {
        let mut chunk = [0u8; 4096];
        let read = socket.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..read]);
        if let Some(position) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
            break position + 4;
        }
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let (method, path) = (request_line.next()?.to_owned(), request_line.next()?.to_owned());
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(name, _)| name == "content-length")
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or(0);
    let mut body = buffer[head_end..].to_vec();
    while body.len() < length {
        let mut chunk = vec![0u8; length - body.len()];
        let read = socket.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..read]);
    }
    Some(Request {
        method,
        path,
        headers,
        body,
    })
}

/// Sends `reply` with chunked encoding, one chunk per part. Returns whether
/// the whole response was delivered (false if the client went away first).
async fn send(socket: &mut TcpStream, reply: &Reply) -> bool {
    let mut head = format!("HTTP/1.1 {} {}\r\n", reply.status, reason(reply.status));
    for (name, value) in &reply.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("transfer-encoding: chunked\r\nconnection: close\r\n\r\n");
    if socket.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    for part in &reply.parts {
        match part {
            Part::Bytes(bytes) => {
                let mut chunk = format!("{:x}\r\n", bytes.len()).into_bytes();
                chunk.extend_from_slice(bytes);
                chunk.extend_from_slice(b"\r\n");
                if socket.write_all(&chunk).await.is_err() || socket.flush().await.is_err() {
                    return false;
                }
            }
            Part::Pause(pause) => {
                if !wait_while_connected(socket, Some(*pause)).await {
                    return false;
                }
            }
            Part::Stall => {
                wait_while_connected(socket, None).await;
                return false;
            }
            Part::Cut => return true,
        }
    }
    socket.write_all(b"0\r\n\r\n").await.is_ok()
}

/// Waits `pause` (or forever), returning early with `false` if the client
/// closes the connection.
async fn wait_while_connected(socket: &mut TcpStream, pause: Option<Duration>) -> bool {
    let closed = async {
        let mut byte = [0u8; 1];
        loop {
            match socket.read(&mut byte).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    match pause {
        Some(pause) => tokio::select! {
            () = closed => false,
            // The scripted pause is the point: an upstream that stalls for it.
            () = tokio::time::sleep(pause) => true,
        },
        None => {
            closed.await;
            false
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        529 => "Overloaded",
        _ => "Status",
    }
}
