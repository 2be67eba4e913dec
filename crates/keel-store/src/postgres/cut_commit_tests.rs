//! A connection lost during `COMMIT`: the writer learns what became of
//! the transaction instead of taking it as not done. A proxy between the
//! store and PostgreSQL cuts the writer's connection right at its
//! `COMMIT`, after passing it on (the commit happens, its answer never
//! arrives) or before (it never happens).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{PostgresCheckpoint, PostgresOptions};
use crate::postgres::local::LocalPostgres;
use crate::{AppendBatch, CheckpointStore, CheckpointStoreExt, EncodedEvent, StoreError};
use keel_protocol::{AssistantContentDeltaEvent, Event, EventMsg};

/// A simple-protocol `Query` message for `COMMIT`, as the client sends it.
const COMMIT: &[u8] = b"Q\0\0\0\x0bCOMMIT\0";

/// Where the next `COMMIT` is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// Passed on to the server, then the connection is cut before its
    /// answer comes back.
    AfterSending,
    /// The connection is cut instead of passing it on.
    BeforeSending,
}

/// A TCP proxy to the shared test server that cuts one `COMMIT` when armed.
struct Proxy {
    port: u16,
    armed: Arc<Mutex<Option<Cut>>>,
}

impl Proxy {
    async fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let port = listener.local_addr().expect("address").port();
        let armed = Arc::new(Mutex::new(None));
        let shared = Arc::clone(&armed);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    continue;
                };
                tokio::spawn(relay(client, server, Arc::clone(&shared)));
            }
        });
        Self { port, armed }
    }

    fn arm(&self, cut: Cut) {
        *self.armed.lock().expect("armed") = Some(cut);
    }

    /// Whether the armed cut happened.
    fn fired(&self) -> bool {
        self.armed.lock().expect("armed").is_none()
    }
}

/// Relays one connection both ways until either side closes, or until the
/// armed cut fires on it.
async fn relay(client: TcpStream, server: TcpStream, armed: Arc<Mutex<Option<Cut>>>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let severed = Arc::new(tokio::sync::Notify::new());
    let answers = {
        let severed = Arc::clone(&severed);
        tokio::spawn(async move {
            let mut buffer = vec![0u8; 1 << 16];
            loop {
                tokio::select! {
                    () = severed.notified() => return,
                    read = server_read.read(&mut buffer) => match read {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if client_write.write_all(&buffer[..n]).await.is_err() {
                                return;
                            }
                        }
                    },
                }
            }
        })
    };
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        let n = match client_read.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let chunk = &buffer[..n];
        let cut = chunk
            .windows(COMMIT.len())
            .any(|window| window == COMMIT)
            .then(|| armed.lock().expect("armed").take())
            .flatten();
        match cut {
            None => {
                if server_write.write_all(chunk).await.is_err() {
                    break;
                }
            }
            Some(cut) => {
                // No answer reaches the client from here on.
                severed.notify_one();
                if cut == Cut::AfterSending {
                    let _ = server_write.write_all(chunk).await;
                    // Time for the server to commit.
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                break;
            }
        }
    }
    answers.abort();
}

fn delta(n: usize) -> Event {
    Event {
        submission_id: None,
        msg: EventMsg::AssistantContentDelta(AssistantContentDeltaEvent {
            turn_id: "t".into(),
            delta: format!("d{n}"),
        }),
    }
}

fn batch(from: usize, count: usize) -> AppendBatch {
    AppendBatch {
        lease: None,
        events: (from..from + count)
            .map(|n| EncodedEvent::encode(&delta(n)).expect("encode"))
            .collect(),
        checkpoint: None,
    }
}

/// The session's stored deltas, in order.
async fn stored(store: &PostgresCheckpoint, session_id: &str) -> Vec<String> {
    store
        .events_after(session_id, 0, 1000)
        .await
        .expect("events")
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::AssistantContentDelta(delta) => Some(delta.delta.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_answer_is_lost_is_answered_by_what_the_database_did() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    let direct = postgres.fresh_database();
    let proxy = Proxy::start(postgres.port()).await;
    let through_proxy = direct.replacen(&format!(":{}/", postgres.port()), &format!(":{}/", proxy.port), 1);
    let store = PostgresCheckpoint::connect(&through_proxy, PostgresOptions::default())
        .await
        .expect("connect through the proxy");
    crate::conformance::create(&store, "s").await;

    // The commit happens, its answer is lost: the append is answered as
    // written, once, and the next one follows it.
    proxy.arm(Cut::AfterSending);
    let receipt = store.append("s", batch(0, 3)).await;
    assert!(proxy.fired(), "the cut happened");
    let receipt = receipt.expect("a commit that happened is answered as written");
    assert_eq!(receipt.first_sequence, 1);
    assert_eq!(stored(&store, "s").await, ["d0", "d1", "d2"]);
    let next = store.append("s", batch(3, 1)).await.expect("the next append");
    assert_eq!(next.first_sequence, 4);

    // The commit never reaches the server: the append fails, nothing of it
    // is stored, and the session goes on from where it was.
    proxy.arm(Cut::BeforeSending);
    let refused = store.append("s", batch(4, 2)).await;
    assert!(proxy.fired(), "the cut happened");
    assert!(matches!(refused, Err(StoreError::Unavailable(_))), "{refused:?}");
    assert_eq!(stored(&store, "s").await, ["d0", "d1", "d2", "d3"]);
    let after = store.append("s", batch(6, 1)).await.expect("an append after");
    assert_eq!(after.first_sequence, 5);
    store.close().await;
}
