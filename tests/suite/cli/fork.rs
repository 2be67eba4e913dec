//! `keel fork`: a new session from another's history at a sequence.

use keel::protocol::{EventMsg, TranscriptItem};
use keel::store::{CheckpointStore, SqliteCheckpoint};

use crate::suite::support::events::assert_gapless;
use crate::suite::support::process::{Cli, assert_one_line_error, parse_events, session_of, stderr, stdout};

#[test]
fn fork_starts_a_session_from_the_history_at_a_sequence() {
    let cli = Cli::new();
    let script = cli.script("s.jsonl", &[r#"{"text": "A."}"#, r#"{"text": "B."}"#]);
    let model = format!("script:{}", script.display());
    let first = cli.run(&["run", "--json", "--model", &model, "one"]);
    assert!(first.status.success(), "{}", stderr(&first));
    let events = parse_events(&first.stdout);
    let session = session_of(&events);
    let end_of_first = events
        .iter()
        .find(|event| event.msg.ends_turn())
        .expect("the first turn ends")
        .sequence;
    let second = cli.run(&["run", "--session", &session, "--model", &model, "two"]);
    assert!(second.status.success(), "{}", stderr(&second));

    let inside = cli.run(&["fork", &session, "--at", &(end_of_first - 1).to_string()]);
    assert_one_line_error(&inside, "inside turn");

    // Before the second turn is where the first one ended.
    let log = cli.events(&session);
    let second_turn = log
        .iter()
        .rev()
        .find_map(|event| match &event.msg {
            EventMsg::TurnStarted(started) => Some(started.turn_id.clone()),
            _ => None,
        })
        .expect("the second turn");
    let before = cli.run(&["fork", &session, "--before-turn", &second_turn, "--id", "before"]);
    assert!(before.status.success(), "{}", stderr(&before));
    assert!(
        stdout(&before).contains(&format!("at {end_of_first} into before (2 history items)")),
        "{}",
        stdout(&before)
    );
    let unknown = cli.run(&["fork", &session, "--before-turn", "no-such-turn"]);
    assert_one_line_error(&unknown, "has no turn 'no-such-turn'");
    let neither = cli.run(&["fork", &session]);
    assert!(!neither.status.success());

    let forked = cli.run(&["fork", &session, "--at", &end_of_first.to_string(), "--id", "child"]);
    assert!(forked.status.success(), "{}", stderr(&forked));
    assert!(
        stdout(&forked).contains("into child (2 history items)"),
        "{}",
        stdout(&forked)
    );
    let taken = cli.run(&["fork", &session, "--at", &end_of_first.to_string(), "--id", "child"]);
    assert_one_line_error(&taken, "already exists");

    let on_fork = cli.run(&["run", "--session", "child", "--model", &model, "three"]);
    assert!(on_fork.status.success(), "{}", stderr(&on_fork));
    let events = cli.events("child");
    assert_gapless(&events, 1);
    match &events[0].msg {
        EventMsg::SessionForked(forked) => {
            assert_eq!(forked.parent_session_id, session);
            assert_eq!(forked.at_sequence, end_of_first);
        }
        other => panic!("a fork starts with session_forked, not {other:?}"),
    }

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (child, parent) = runtime.block_on(async {
        let store = SqliteCheckpoint::new(cli.db()).expect("open");
        let child = store.load("child").await.expect("read").expect("stored");
        let parent = store.load(&session).await.expect("read").expect("stored");
        (child.transcript, parent.transcript)
    });
    let texts = |items: &[TranscriptItem]| -> Vec<String> {
        items
            .iter()
            .map(|item| match item {
                TranscriptItem::UserMessage { text } | TranscriptItem::AssistantMessage { text, .. } => text.clone(),
                other => panic!("unexpected item {other:?}"),
            })
            .collect()
    };
    assert_eq!(texts(&child), ["one", "A.", "three", "A."]);
    assert_eq!(texts(&parent), ["one", "A.", "two", "B."]);
}
