//! Log notifications: every commit that appends events to a session sends
//! `pg_notify('keel_log', '<session id> <last sequence>')` in its own
//! transaction (see `writer.rs`), so PostgreSQL delivers it at commit and
//! never for a rolled-back write. [`start`] receives them on a
//! connection of its own, behind the store's [`NoticeListener`].
//!
//! A notification carries a session id and a sequence, never events: a
//! consumer reads the events from the log. Notifications can be missed (the
//! connection was lost, the consumer fell behind); the listener then yields
//! [`LogNotice::Resync`], after which the consumer re-reads what it follows.

use std::future::poll_fn;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;
use tokio_postgres::tls::NoTlsStream;
use tokio_postgres::{AsyncMessage, Client, Config, Connection, NoTls, Socket};

use crate::notice::{CarriedEvents, LogNotice, NoticeListener};
use crate::{RelayedSubmission, StoreError};

/// The channel log notifications are sent on.
pub const LOG_CHANNEL: &str = "keel_log";

/// The channel that announces a session with submissions relayed to its
/// owner, or a session released with work left (payload: the session id, a
/// newline, and its live owner's id, empty when it has none).
pub const RELAY_CHANNEL: &str = "keel_relay";

/// The channel that announces answers to submissions relayed to a
/// session's owner (payload: the session id).
pub(super) const ANSWER_CHANNEL: &str = "keel_answer";

/// How many notices wait for the consumer, by default, before the listener
/// drops them (and yields [`LogNotice::Resync`] once there is room again).
pub const NOTICE_BUFFER: usize = 1024;

/// The longest wait between two attempts to reconnect.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Connects and listens; returns once the server has registered the
/// `LISTEN`, so every commit after this call is noticed.
pub(super) async fn start(config: Config, capacity: usize) -> Result<NoticeListener, StoreError> {
    let (client, connection) = listening(&config).await?;
    let (sender, notices) = mpsc::channel(capacity.max(1));
    let task = tokio::spawn(run(config, client, connection, sender));
    Ok(NoticeListener::new(notices, task))
}

type Conn = Connection<Socket, NoTlsStream>;

/// Opens a connection and runs `LISTEN` on it, driving the connection
/// meanwhile.
async fn listening(config: &Config) -> Result<(Client, Conn), StoreError> {
    let (client, mut connection) = config.connect(NoTls).await.map_err(super::connect_error)?;
    let statement = format!("LISTEN {LOG_CHANNEL}; LISTEN {RELAY_CHANNEL}; LISTEN {ANSWER_CHANNEL}");
    {
        let listen = client.batch_execute(&statement);
        tokio::pin!(listen);
        loop {
            tokio::select! {
                done = &mut listen => {
                    done.map_err(super::pg_error)?;
                    break;
                }
                message = poll_fn(|cx| connection.poll_message(cx)) => match message {
                    Some(Ok(_)) => {}
                    Some(Err(error)) => return Err(super::pg_error(error)),
                    None => return Err(StoreError::Unavailable("the listening connection closed".to_owned())),
                },
            }
        }
    }
    Ok((client, connection))
}

/// Parses a notification on `channel`; `None` for a malformed one.
fn notice(channel: &str, payload: &str) -> Option<LogNotice> {
    match channel {
        LOG_CHANNEL => parse(payload),
        RELAY_CHANNEL => {
            // Neither ids nor node ids hold control characters.
            let mut lines = payload.splitn(3, '\n');
            let session_id = lines.next().filter(|id| !id.is_empty())?;
            let owner = lines.next().unwrap_or("");
            Some(LogNotice::Relay {
                session_id: session_id.to_owned(),
                owner: (!owner.is_empty()).then(|| owner.to_owned()),
                carried: lines.next().and_then(carried_row).map(Box::new),
            })
        }
        ANSWER_CHANNEL => answered(payload),
        _ => None,
    }
}

/// Parses the relayed row a relay notice carries,
/// `<relay id>\t<submission id>\t<key, or nothing>\t<submission JSON>`
/// (keys and ids hold no tab, JSON no raw control character); `None` when
/// it does not parse: the owner reads the row instead.
fn carried_row(line: &str) -> Option<RelayedSubmission> {
    let mut fields = line.splitn(4, '\t');
    let relay_id = fields.next()?.parse().ok()?;
    let submission_id = fields.next().filter(|id| !id.is_empty())?;
    let key = fields.next()?;
    let submission: RelayedSubmission = serde_json::from_str(fields.next()?).ok()?;
    Some(RelayedSubmission {
        relay_id,
        submission_id: submission_id.to_owned(),
        idempotency_key: (!key.is_empty()).then(|| key.to_owned()),
        ..submission
    })
}

/// Parses an answer payload: the session id, then a line
/// `<relay id>\t<answer JSON>` per answer carried. An answer that does not
/// parse is left out: the waiting node reads it from the row.
fn answered(payload: &str) -> Option<LogNotice> {
    let mut lines = payload.split('\n');
    let session_id = lines.next().filter(|id| !id.is_empty())?;
    let answers = lines
        .filter_map(|line| {
            let (id, answer) = line.split_once('\t')?;
            Some((id.parse().ok()?, serde_json::from_str(answer).ok()?))
        })
        .collect();
    Some(LogNotice::Answered {
        session_id: session_id.to_owned(),
        answers,
    })
}

/// Parses a log payload, `<session id> <last sequence>`, then, when it
/// carries the events, `\n<recorded at, ms>\n<the stored events, base64>`.
fn parse(payload: &str) -> Option<LogNotice> {
    // Session ids hold no control characters.
    let (head, carried) = match payload.split_once('\n') {
        Some((head, carried)) => (head, Some(carried)),
        None => (payload, None),
    };
    let (session_id, sequence) = head.rsplit_once(' ')?;
    Some(LogNotice::Log {
        session_id: session_id.to_owned(),
        last_sequence: sequence.parse().ok()?,
        carried: carried.and_then(|carried| {
            let (recorded_at_ms, encoded) = carried.split_once('\n')?;
            Some(CarriedEvents {
                recorded_at_ms: recorded_at_ms.parse().ok()?,
                encoded: encoded.to_owned(),
            })
        }),
    })
}

/// Forwards notifications until the consumer goes away, reconnecting after
/// a lost connection.
async fn run(config: Config, mut client: Client, mut connection: Conn, sender: mpsc::Sender<LogNotice>) {
    // Whether notices were dropped since the last `Resync`.
    let mut missed = false;
    loop {
        loop {
            tokio::select! {
                message = poll_fn(|cx| connection.poll_message(cx)) => match message {
                    Some(Ok(AsyncMessage::Notification(notification))) => {
                        if missed {
                            continue;
                        }
                        let Some(notice) = notice(notification.channel(), notification.payload()) else {
                            tracing::warn!(payload = notification.payload(), "malformed log notification");
                            continue;
                        };
                        match sender.try_send(notice) {
                            Ok(()) => {}
                            Err(TrySendError::Full(_)) => missed = true,
                            Err(TrySendError::Closed(_)) => return,
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(error)) => {
                        tracing::warn!(%error, "the log listener's connection failed; reconnecting");
                        break;
                    }
                    None => {
                        tracing::warn!("the log listener's connection closed; reconnecting");
                        break;
                    }
                },
                permit = sender.reserve(), if missed => match permit {
                    Ok(permit) => {
                        permit.send(LogNotice::Resync);
                        missed = false;
                    }
                    Err(_) => return,
                },
                () = sender.closed() => return,
            }
        }
        drop(client);
        let mut backoff = Duration::from_millis(50);
        (client, connection) = loop {
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = sender.closed() => return,
            }
            match listening(&config).await {
                Ok(listening) => break listening,
                Err(error) => {
                    tracing::debug!(%error, "the log listener cannot reconnect yet");
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        };
        tracing::info!("the log listener reconnected");
        // Whatever was committed while it was away was not noticed.
        missed = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_parse_to_notices() {
        assert_eq!(
            parse("a b 12"),
            Some(LogNotice::Log {
                session_id: "a b".to_owned(),
                last_sequence: 12,
                carried: None,
            })
        );
        assert_eq!(
            parse("a b 12\n1700\nW10="),
            Some(LogNotice::Log {
                session_id: "a b".to_owned(),
                last_sequence: 12,
                carried: Some(CarriedEvents {
                    recorded_at_ms: 1700,
                    encoded: "W10=".to_owned()
                }),
            })
        );
        assert!(
            matches!(parse("a b 12\nsoon\nW10="), Some(LogNotice::Log { carried: None, .. })),
            "events that do not parse are read instead"
        );
        assert_eq!(parse("nosequence"), None);
        assert_eq!(parse("s x"), None);
        assert_eq!(
            notice(RELAY_CHANNEL, "a b\nnode-1"),
            Some(LogNotice::Relay {
                session_id: "a b".to_owned(),
                owner: Some("node-1".to_owned()),
                carried: None,
            })
        );
        assert_eq!(
            notice(RELAY_CHANNEL, "a b\n"),
            Some(LogNotice::Relay {
                session_id: "a b".to_owned(),
                owner: None,
                carried: None,
            })
        );
        // A carried row: id, submission id, key (or nothing), JSON.
        let json = r#"{"op":{"type":"user_input","text":"hi\tthere"},"on_busy":"queue"}"#;
        let Some(LogNotice::Relay { carried: Some(row), .. }) =
            notice(RELAY_CHANNEL, &format!("a b\nnode-1\n7\tsub-1\tkey-1\t{json}"))
        else {
            panic!("no carried row");
        };
        assert_eq!(
            (row.relay_id, row.submission_id.as_str(), row.idempotency_key.as_deref()),
            (7, "sub-1", Some("key-1"))
        );
        assert_eq!(
            row.op,
            keel_protocol::Op::UserInput {
                text: "hi\tthere".to_owned()
            }
        );
        let unkeyed = notice(RELAY_CHANNEL, &format!("a b\nnode-1\n7\tsub-1\t\t{json}"));
        assert!(matches!(unkeyed, Some(LogNotice::Relay { carried: Some(row), .. }) if row.idempotency_key.is_none()));
        // A row that does not parse is left out: the owner reads it.
        for bad in ["x\tsub\t\t{}", "7\t\t\t{}", "7\tsub\t\tnot json", "7\tsub"] {
            assert_eq!(
                notice(RELAY_CHANNEL, &format!("a b\nnode-1\n{bad}")),
                Some(LogNotice::Relay {
                    session_id: "a b".to_owned(),
                    owner: Some("node-1".to_owned()),
                    carried: None,
                }),
                "{bad}"
            );
        }
        assert_eq!(notice(RELAY_CHANNEL, ""), None);
        assert_eq!(
            notice(ANSWER_CHANNEL, "a b"),
            Some(LogNotice::Answered {
                session_id: "a b".to_owned(),
                answers: Vec::new(),
            })
        );
        let accepted = crate::RelayOutcome::Accepted {
            submission_id: "x".to_owned(),
            sequence: 4,
            duplicate: false,
        };
        let carried = format!(
            "s\n7\t{}\n8\tnot json\nnine\t{{}}",
            serde_json::to_string(&accepted).expect("json")
        );
        assert_eq!(
            notice(ANSWER_CHANNEL, &carried),
            Some(LogNotice::Answered {
                session_id: "s".to_owned(),
                answers: vec![(7, accepted)],
            }),
            "what does not parse is read from the row"
        );
        assert_eq!(notice(ANSWER_CHANNEL, ""), None);
        assert_eq!(notice("other", "a 1"), None);
    }
}
