//! A webhook receiver for the benchmarks: answers every delivery `204` at
//! once and records how long after its event's commit it arrived (the
//! body's `data.event.recorded_at_ms`, on this machine's clock). Not a
//! verifier: the tests judge deliveries with the Standard Webhooks library;
//! this only times them.

use std::sync::{Arc, Mutex};

use keel_protocol::now_ms;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use keel_protocol::Error;

/// The largest delivery body read.
const MAX_BODY: usize = 1 << 20;

/// A running receiver.
pub(crate) struct WebhookSink {
    /// Where to post (`http://127.0.0.1:PORT/hook`).
    pub(crate) url: String,
    /// Its base URL (`http://127.0.0.1:PORT`), for an OTLP exporter, whose
    /// posts it answers too (and does not time).
    pub(crate) base: String,
    latencies: Arc<Mutex<Vec<f64>>>,
    task: JoinHandle<()>,
}

impl WebhookSink {
    /// Listens on a free loopback port.
    pub(crate) async fn start() -> keel_protocol::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|error| Error::Config(format!("cannot listen for webhooks: {error}")))?;
        let address = listener
            .local_addr()
            .map_err(|error| Error::Config(format!("cannot listen for webhooks: {error}")))?;
        let latencies = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn({
            let latencies = Arc::clone(&latencies);
            async move {
                while let Ok((stream, _)) = listener.accept().await {
                    tokio::spawn(serve(stream, Arc::clone(&latencies)));
                }
            }
        });
        Ok(Self {
            url: format!("http://{address}/hook"),
            base: format!("http://{address}"),
            latencies,
            task,
        })
    }

    /// The commit-to-arrival times so far, in ms.
    pub(crate) fn latencies(&self) -> Vec<f64> {
        self.latencies
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .clone()
    }
}

impl Drop for WebhookSink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Answers the requests of one kept-alive connection.
async fn serve(stream: TcpStream, latencies: Arc<Mutex<Vec<f64>>>) {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        loop {
            line.clear();
            match read.read_line(&mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let trimmed = line.trim_end();
            if trimmed.is_empty() {
                break;
            }
            if let Some((name, value)) = trimmed.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length.min(MAX_BODY)];
        if read.read_exact(&mut body).await.is_err() {
            return;
        }
        let arrived = now_ms();
        if let Ok(delivery) = serde_json::from_slice::<serde_json::Value>(&body)
            && let Some(recorded) = delivery["data"]["event"]["recorded_at_ms"].as_u64()
        {
            latencies
                .lock()
                .unwrap_or_else(|poison| poison.into_inner())
                .push(arrived.saturating_sub(recorded) as f64);
        }
        if write
            .write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
    }
}
