use std::collections::HashSet;

use keel_protocol::*;
use serde_json::json;

use super::*;

/// A log built one event at a time, with sequences from 1.
#[derive(Default)]
struct Log(Vec<RecordedEvent>);

impl Log {
    fn add(&mut self, submission: Option<&str>, msg: EventMsg) -> &mut Self {
        let sequence = self.0.len() as u64 + 1;
        self.0.push(RecordedEvent {
            sequence,
            recorded_at_ms: 1_000 + sequence,
            event: Event {
                submission_id: submission.map(str::to_owned),
                msg,
            },
        });
        self
    }

    fn user_turn(&mut self, submission: &str, key: &str, turn: &str, text: &str) -> &mut Self {
        self.add(
            Some(submission),
            EventMsg::SubmissionQueued(SubmissionQueuedEvent {
                traceparent: None,
                op: Op::UserInput { text: text.to_owned() },
                on_busy: BusyPolicy::Queue,
                idempotency_key: Some(key.to_owned()),
                submitted_by: None,
            }),
        )
        .add(
            Some(submission),
            EventMsg::TurnStarted(TurnStartedEvent {
                turn_id: turn.to_owned(),
                trace_id: None,
            }),
        )
        .add(
            Some(submission),
            EventMsg::UserMessage(UserMessageEvent {
                turn_id: turn.to_owned(),
                text: text.to_owned(),
            }),
        )
    }

    fn step(&mut self, turn: &str, step: u32) -> &mut Self {
        self.add(
            None,
            EventMsg::ModelStepStarted(ModelStepStartedEvent {
                turn_id: turn.to_owned(),
                step,
                message_id: Some(format!("{turn}-{step}")),
            }),
        )
    }

    fn text(&mut self, turn: &str, step: u32, deltas: &[&str]) -> &mut Self {
        for delta in deltas {
            self.add(
                None,
                EventMsg::AssistantContentDelta(AssistantContentDeltaEvent {
                    turn_id: turn.to_owned(),
                    delta: (*delta).to_owned(),
                }),
            );
        }
        self.add(
            None,
            EventMsg::AssistantMessage(AssistantMessageEvent {
                turn_id: turn.to_owned(),
                text: deltas.concat(),
                message_id: Some(format!("{turn}-{step}")),
            }),
        )
    }

    fn call(&mut self, turn: &str, call: &str, name: &str) -> &mut Self {
        self.add(
            None,
            EventMsg::ToolCallStarted(ToolCallStartedEvent {
                turn_id: turn.to_owned(),
                call_id: call.to_owned(),
                name: name.to_owned(),
                arguments: r#"{"path":"a.txt"}"#.to_owned(),
            }),
        )
    }

    fn result(&mut self, turn: &str, call: &str, output: &str) -> &mut Self {
        self.add(
            None,
            EventMsg::ToolCallCompleted(ToolCallCompletedEvent {
                turn_id: turn.to_owned(),
                call_id: call.to_owned(),
                output: output.to_owned(),
                is_error: false,
            }),
        )
    }

    fn complete(&mut self, turn: &str) -> &mut Self {
        self.add(
            None,
            EventMsg::TurnComplete(TurnCompleteEvent {
                turn_id: turn.to_owned(),
                length_limited: false,
            }),
        )
    }

    fn ask_approval(&mut self, turn: &str, call: &str) -> &mut Self {
        self.add(
            None,
            EventMsg::ApprovalRequested(ApprovalRequestedEvent {
                turn_id: turn.to_owned(),
                call_id: call.to_owned(),
                name: "write_file".to_owned(),
                arguments: r#"{"path":"a.txt"}"#.to_owned(),
            }),
        )
    }
}

/// Every event of `log[from..]` through `run`, then `settle`, as JSON.
fn project(run: &mut RunProjection, log: &[RecordedEvent]) -> Vec<serde_json::Value> {
    let mut out = run.open();
    for event in log {
        out.extend(run.push(event));
    }
    out.extend(run.settle());
    out.iter().map(|event| serde_json::to_value(event).unwrap()).collect()
}

fn types(events: &[serde_json::Value]) -> Vec<&str> {
    events.iter().map(|event| event["type"].as_str().unwrap()).collect()
}

fn ours(ids: &[&str]) -> RunStart {
    RunStart::Submissions(ids.iter().map(|id| (*id).to_owned()).collect())
}

#[test]
fn a_text_turn_is_one_run_with_a_step_and_a_text_message() {
    let mut log = Log::default();
    log.user_turn("s1", "m1", "t1", "Hi")
        .step("t1", 1)
        .text("t1", 1, &["Hel", "lo"])
        .complete("t1");
    let mut run = RunProjection::new("thread", Thread::new(), ours(&["s1"]));
    let events = project(&mut run, &log.0);
    assert_eq!(
        types(&events),
        [
            "RUN_STARTED",
            "STEP_STARTED",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END",
            "STEP_FINISHED",
            "RUN_FINISHED"
        ]
    );
    assert_eq!(
        events[0],
        json!({"type": "RUN_STARTED", "threadId": "thread", "runId": "t1"})
    );
    assert_eq!(
        events[2],
        json!({"type": "TEXT_MESSAGE_START", "messageId": "t1-1", "role": "assistant"})
    );
    assert_eq!(
        events[7],
        json!({"type": "RUN_FINISHED", "threadId": "thread", "runId": "t1", "outcome": {"type": "success"}})
    );
    assert!(run.finished());
    let messages = serde_json::to_value(run.thread().messages()).unwrap();
    assert_eq!(
        messages,
        json!([
            {"role": "user", "id": "m1", "content": "Hi"},
            {"role": "assistant", "id": "t1-1", "content": "Hello"}
        ])
    );
}

#[test]
fn a_run_waits_for_its_own_turn_and_skips_the_one_before() {
    let mut log = Log::default();
    log.user_turn("s0", "m0", "t0", "first")
        .step("t0", 1)
        .text("t0", 1, &["one"])
        .complete("t0")
        .user_turn("s1", "m1", "t1", "second")
        .step("t1", 1)
        .text("t1", 1, &["two"])
        .complete("t1");
    let mut run = RunProjection::new("thread", Thread::new(), ours(&["s1"]));
    let events = project(&mut run, &log.0);
    assert_eq!(events[0]["runId"], "t1");
    assert_eq!(events[3]["delta"], "two");
    assert_eq!(events.len(), 7, "{events:?}");
}

#[test]
fn an_approval_interrupts_the_run_and_the_resumed_run_streams_the_rest_of_the_turn() {
    let mut log = Log::default();
    log.user_turn("s1", "m1", "t1", "write it")
        .step("t1", 1)
        .text("t1", 1, &[])
        .ask_approval("t1", "c1");
    let mut first = RunProjection::new("thread", Thread::new(), ours(&["s1"]));
    let mut out = Vec::new();
    for event in &log.0 {
        out.extend(first.push(event));
    }
    assert!(first.waiting());
    assert!(!first.finished());
    out.extend(first.settle());
    let events: Vec<_> = out.iter().map(|event| serde_json::to_value(event).unwrap()).collect();
    assert_eq!(
        types(&events),
        [
            "RUN_STARTED",
            "STEP_STARTED",
            "TOOL_CALL_START",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_END",
            "STEP_FINISHED",
            "RUN_FINISHED"
        ]
    );
    assert_eq!(events[2]["parentMessageId"], "t1-1");
    assert_eq!(
        events[6]["outcome"],
        json!({"type": "interrupt", "interrupts": [{
            "id": "c1", "reason": "tool_approval", "message": "Allow the tool 'write_file' to run?", "toolCallId": "c1"
        }]})
    );
    assert_eq!(first.thread().waits().len(), 1);

    // The next run answers c1.
    let primed = first.thread().clone();
    let resume_at = log.0.len();
    log.add(
        Some("s2"),
        EventMsg::ApprovalDecided(ApprovalDecidedEvent {
            turn_id: "t1".to_owned(),
            call_id: "c1".to_owned(),
            decision: ApprovalDecision::Approve,
            decided_by: None,
        }),
    )
    .call("t1", "c1", "write_file")
    .result("t1", "c1", "wrote a.txt")
    .step("t1", 2)
    .text("t1", 2, &["Done."])
    .complete("t1");
    let mut second = RunProjection::new(
        "thread",
        primed,
        RunStart::Resume {
            turn_id: "t1".to_owned(),
            run_id: "t1.9".to_owned(),
            answered: HashSet::from(["c1".to_owned()]),
        },
    );
    let mut out = second.open();
    assert!(!second.waiting(), "the answered call does not hold the run");
    for event in &log.0[resume_at..] {
        out.extend(second.push(event));
    }
    let events: Vec<_> = out.iter().map(|event| serde_json::to_value(event).unwrap()).collect();
    assert_eq!(
        types(&events),
        [
            "RUN_STARTED",
            "TOOL_CALL_RESULT",
            "STEP_STARTED",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END",
            "STEP_FINISHED",
            "RUN_FINISHED"
        ]
    );
    assert_eq!(
        events[0],
        json!({"type": "RUN_STARTED", "threadId": "thread", "runId": "t1.9", "parentRunId": "t1"})
    );
    assert_eq!(
        events[1],
        json!({"type": "TOOL_CALL_RESULT", "messageId": "c1-result", "toolCallId": "c1", "content": "wrote a.txt", "role": "tool"})
    );
    assert_eq!(events[7]["outcome"], json!({"type": "success"}));
    let messages = serde_json::to_value(second.thread().messages()).unwrap();
    assert_eq!(messages[1]["toolCalls"][0]["function"]["name"], "write_file");
    assert_eq!(messages[2]["role"], "tool");
    assert_eq!(messages[3]["content"], "Done.");
}

#[test]
fn a_turn_closed_after_a_crash_ends_the_run_with_an_error() {
    let mut log = Log::default();
    log.user_turn("s1", "m1", "t1", "Hi")
        .step("t1", 1)
        .add(
            None,
            EventMsg::AssistantContentDelta(AssistantContentDeltaEvent {
                turn_id: "t1".to_owned(),
                delta: "Hal".to_owned(),
            }),
        )
        .add(
            None,
            EventMsg::TurnAborted(TurnAbortedEvent {
                turn_id: "t1".to_owned(),
                reason: AbortReason::RuntimeStopped,
                message: "the runtime stopped while the turn ran".to_owned(),
            }),
        );
    let mut run = RunProjection::new("thread", Thread::new(), ours(&["s1"]));
    let events = project(&mut run, &log.0);
    assert_eq!(
        types(&events),
        [
            "RUN_STARTED",
            "STEP_STARTED",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END",
            "STEP_FINISHED",
            "RUN_ERROR"
        ]
    );
    assert_eq!(
        events[6],
        json!({"type": "RUN_ERROR", "message": "the runtime stopped while the turn ran", "code": "runtime_stopped"})
    );
    assert!(run.finished());
}

#[test]
fn an_interrupted_turn_is_a_cancelled_run_and_reasoning_is_streamed() {
    let mut log = Log::default();
    log.user_turn("s1", "m1", "t1", "Hi").step("t1", 1).add(
        None,
        EventMsg::ReasoningDelta(ReasoningDeltaEvent {
            turn_id: "t1".to_owned(),
            delta: "hmm".to_owned(),
        }),
    );
    log.text("t1", 1, &["Yes"]).add(
        None,
        EventMsg::TurnAborted(TurnAbortedEvent {
            turn_id: "t1".to_owned(),
            reason: AbortReason::Interrupted,
            message: "interrupted".to_owned(),
        }),
    );
    let mut run = RunProjection::new("thread", Thread::new(), ours(&["s1"]));
    let events = project(&mut run, &log.0);
    assert_eq!(
        types(&events)[2..7],
        [
            "REASONING_START",
            "REASONING_MESSAGE_START",
            "REASONING_MESSAGE_CONTENT",
            "REASONING_MESSAGE_END",
            "REASONING_END"
        ]
    );
    assert_eq!(events[2]["messageId"], "t1-1-reasoning");
    assert_eq!(events.last().unwrap()["outcome"], json!({"type": "cancelled"}));
}

#[test]
fn a_client_tool_ends_the_run_as_success_naming_the_pending_call() {
    let mut log = Log::default();
    log.user_turn("s1", "m1", "t1", "where am I?")
        .step("t1", 1)
        .text("t1", 1, &[])
        .call("t1", "c2", "get_location")
        .add(
            None,
            EventMsg::ClientToolRequested(ClientToolRequestedEvent {
                turn_id: "t1".to_owned(),
                call_id: "c2".to_owned(),
                name: "get_location".to_owned(),
                arguments: "{}".to_owned(),
                expires_at_ms: None,
            }),
        );
    let mut run = RunProjection::new("thread", Thread::new(), ours(&["s1"]));
    let events = project(&mut run, &log.0);
    assert_eq!(
        events.last().unwrap()["outcome"],
        json!({"type": "success", "pendingToolCallIds": ["c2"]})
    );
    // The client answers with a tool message after the assistant's call.
    let thread = run.thread().clone();
    let input = parse(json!({"threadId": "thread", "runId": "r2", "messages": [
        {"id": "m1", "role": "user", "content": "where am I?"},
        {"id": "t1-1", "role": "assistant", "toolCalls": [
            {"id": "c2", "type": "function", "function": {"name": "get_location", "arguments": "{}"}}
        ]},
        {"id": "x", "role": "tool", "toolCallId": "c2", "content": "Paris"}
    ]}))
    .unwrap();
    let plan = plan(&input, &thread).unwrap();
    assert_eq!(
        plan.answers,
        [(
            "c2".to_owned(),
            Op::ClientToolResult {
                call_id: "c2".to_owned(),
                output: "Paris".to_owned(),
                is_error: false
            }
        )]
    );
    assert!(plan.user_messages.is_empty());
}

fn finished_thread() -> Thread {
    let mut log = Log::default();
    log.user_turn("s1", "m1", "t1", "Hi")
        .step("t1", 1)
        .text("t1", 1, &["Hello"])
        .complete("t1");
    Thread::from_log(&log.0)
}

fn input(messages: serde_json::Value, extra: serde_json::Value) -> Result<RunInput<'static>, InputError> {
    let mut body = json!({"threadId": "thread", "runId": "r", "messages": messages, "state": {}, "context": []});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    parse(body)
}

#[test]
fn a_matching_history_and_a_new_user_message_become_one_submission() {
    let thread = finished_thread();
    let sent = input(
        json!([
            {"id": "m1", "role": "user", "content": "Hi"},
            {"id": "t1-1", "role": "assistant", "content": "Hello"},
            {"id": "sys", "role": "system", "content": "ignored"},
            {"id": "m2", "role": "user", "content": [{"type": "text", "text": "More"}]}
        ]),
        json!({}),
    )
    .unwrap();
    let plan = plan(&sent, &thread).unwrap();
    assert_eq!(plan.user_messages, [("m2".to_owned(), "More".to_owned())]);
    // A retry of the first run (the session has m1 and its answer) is the
    // same submission again, not a fork.
    let retry = input(json!([{"id": "m1", "role": "user", "content": "Hi"}]), json!({})).unwrap();
    assert_eq!(
        super::plan(&retry, &thread).unwrap().user_messages,
        [("m1".to_owned(), "Hi".to_owned())]
    );
}

#[test]
fn a_forked_history_is_refused_naming_the_first_difference() {
    let thread = finished_thread();
    let forked = input(
        json!([
            {"id": "m1", "role": "user", "content": "Hi"},
            {"id": "a", "role": "assistant", "content": "Bonjour"},
            {"id": "m2", "role": "user", "content": "More"}
        ]),
        json!({}),
    )
    .unwrap();
    let error = plan(&forked, &thread).unwrap_err();
    assert_eq!(
        error,
        InputError::HistoryMismatch(
            "the history forks from the session's at message 2: the session has the assistant message \"Hello\", \
             the request the assistant message \"Bonjour\""
                .to_owned()
        )
    );
    let short = input(json!([{"id": "m9", "role": "user", "content": "new"}]), json!({})).unwrap();
    assert!(
        matches!(plan(&short, &thread), Err(InputError::HistoryMismatch(message)) if message.contains("message 1"))
    );
}

#[test]
fn bad_input_is_refused_before_anything_is_planned() {
    let thread = finished_thread();
    for (body, needle) in [
        (json!({"threadId": "t"}), "not a RunAgentInput"),
        (
            json!({"threadId": "t", "runId": "r", "messages": [{"id": "x", "role": "robot", "content": "?"}]}),
            "unknown role 'robot'",
        ),
        (
            json!({"threadId": "t", "runId": "r", "messages": [{"id": "x", "role": "user", "content": [{"type": "image", "source": {"type": "url", "value": "http://x"}}]}]}),
            "content parts of type 'image'",
        ),
        (
            json!({"threadId": "t", "runId": "r", "messages": [{"id": "x", "role": "developer", "content": {}}]}),
            "a developer message's `content` is text",
        ),
        (
            json!({"threadId": "t", "runId": "r", "messages": [{"id": "x", "role": "activity", "content": "?"}]}),
            "an activity message's `content` is an object",
        ),
    ] {
        let error = parse(body).unwrap_err();
        assert!(
            matches!(&error, InputError::Malformed(message) if message.contains(needle)),
            "{error:?}"
        );
    }
    let stale = input(
        json!([
            {"id": "m1", "role": "user", "content": "Hi"},
            {"id": "t1-1", "role": "assistant", "content": "Hello"}
        ]),
        json!({"resume": [{"interruptId": "c9", "status": "resolved"}]}),
    )
    .unwrap();
    assert_eq!(
        plan(&stale, &thread).unwrap_err(),
        InputError::NotWaiting("no tool call 'c9' waits for an answer in this thread".to_owned())
    );
}

#[test]
fn resume_payloads_become_approval_decisions() {
    let mut log = Log::default();
    log.user_turn("s1", "m1", "t1", "write")
        .step("t1", 1)
        .text("t1", 1, &[])
        .ask_approval("t1", "c1");
    let thread = Thread::from_log(&log.0);
    let history = json!([
        {"id": "m1", "role": "user", "content": "write"},
        {"id": "t1-1", "role": "assistant", "toolCalls": [{"id": "c1", "type": "function", "function": {"name": "write_file", "arguments": "{}"}}]}
    ]);
    let twice = input(
        history.clone(),
        json!({"resume": [{"interruptId": "c1", "status": "resolved"}, {"interruptId": "c1", "status": "cancelled"}]}),
    )
    .unwrap();
    assert!(matches!(plan(&twice, &thread), Err(InputError::Malformed(message)) if message.contains("twice")));
    for (entry, decision) in [
        (
            json!({"interruptId": "c1", "status": "resolved"}),
            ApprovalDecision::Approve,
        ),
        (
            json!({"interruptId": "c1", "status": "resolved", "payload": {"approved": false}}),
            ApprovalDecision::Deny,
        ),
        (
            json!({"interruptId": "c1", "status": "resolved", "payload": {"decision": "approve_for_session"}}),
            ApprovalDecision::ApproveForSession,
        ),
        (
            json!({"interruptId": "c1", "status": "cancelled"}),
            ApprovalDecision::Deny,
        ),
    ] {
        let sent = input(history.clone(), json!({"resume": [entry]})).unwrap();
        assert_eq!(
            plan(&sent, &thread).unwrap().answers,
            [(
                "c1".to_owned(),
                Op::Approval {
                    call_id: "c1".to_owned(),
                    decision
                }
            )]
        );
    }
}

/// The server reads a body's bytes straight into [`RunAgentBody`], its
/// texts borrowed where they have no escapes: that reads what a parsed
/// JSON tree reads, and refuses what it refuses, with the same messages.
#[test]
fn a_body_read_from_its_bytes_is_the_body_read_as_json() {
    let thread = finished_thread();
    let body = json!({"threadId": "thread", "runId": "r", "messages": [
        {"id": "m1", "role": "user", "content": "Hi"},
        {"id": "t1-1", "role": "assistant", "content": "Hello", "toolCalls": []},
        {"id": "m2", "role": "user", "content": "two\nlines \"quoted\" \u{e9}"},
        {"id": "m3", "role": "user", "content": [{"type": "text", "text": "parts"}]}
    ]});
    let bytes = body.to_string();
    let wire: RunAgentBody<'_> = serde_json::from_str(&bytes).unwrap();
    let read_from_bytes = read(wire).unwrap();
    assert!(
        matches!(
            &read_from_bytes.messages[0],
            InputMessage::User {
                text: std::borrow::Cow::Borrowed("Hi"),
                ..
            }
        ),
        "an unescaped text is borrowed: {:?}",
        read_from_bytes.messages[0]
    );
    assert_eq!(read_from_bytes, parse(body).unwrap());
    assert_eq!(
        plan(&read_from_bytes, &thread).unwrap().user_messages,
        [
            ("m2".to_owned(), "two\nlines \"quoted\" \u{e9}".to_owned()),
            ("m3".to_owned(), "parts".to_owned())
        ]
    );
    for (messages, needle) in [
        (
            r#"[{"id": "x", "role": 7, "content": "a"}]"#,
            "messages[0]: has no `role`",
        ),
        (
            r#"[{"id": ["x"], "role": "user", "content": "a"}]"#,
            "messages[0]: has no `id`",
        ),
        (
            r#"[{"id": "x", "role": "assistant", "content": {"text": "a"}}]"#,
            "an assistant message's `content` is text",
        ),
        (
            r#"[{"id": "x", "role": "user", "content": null}]"#,
            "`content` is text or a list of text parts",
        ),
    ] {
        let bytes = format!(r#"{{"threadId": "t", "runId": "r", "messages": {messages}}}"#);
        let wire: RunAgentBody<'_> = serde_json::from_str(&bytes).unwrap();
        let error = read(wire).unwrap_err();
        assert!(
            matches!(&error, InputError::Malformed(message) if message.contains(needle)),
            "{messages}: {error:?}"
        );
    }
}

/// A thread whose second turn was cancelled after streaming "Once upon"
/// (no complete message), or, when `open`, is still streaming it (a node
/// died, the turn is not closed yet).
fn broken_off_thread(open: bool) -> Thread {
    let mut log = Log::default();
    log.user_turn("s1", "m1", "t1", "Hi")
        .step("t1", 1)
        .text("t1", 1, &["Hello"])
        .complete("t1")
        .user_turn("s2", "m2", "t2", "Tell a story")
        .step("t2", 1);
    for delta in ["Once", " upon"] {
        log.add(
            None,
            EventMsg::AssistantContentDelta(AssistantContentDeltaEvent {
                turn_id: "t2".to_owned(),
                delta: delta.to_owned(),
            }),
        );
    }
    if !open {
        log.add(
            None,
            EventMsg::TurnAborted(TurnAbortedEvent {
                turn_id: "t2".to_owned(),
                reason: AbortReason::Interrupted,
                message: "interrupted".to_owned(),
            }),
        );
    }
    Thread::from_log(&log.0)
}

#[test]
fn a_broken_off_answer_is_the_history_the_client_kept_of_it() {
    for open in [false, true] {
        broken_off_answer(open);
    }
    // The text streamed is not a message of the thread's until its turn
    // ends.
    assert_eq!(broken_off_thread(true).messages().len(), 3);
    assert_eq!(broken_off_thread(false).messages().len(), 4);
}

fn broken_off_answer(open: bool) {
    let thread = broken_off_thread(open);
    assert_eq!(thread.history()[3].text(), "Once upon", "kept as it streamed");
    let with = |answer: Option<&str>| {
        let mut messages = vec![
            json!({"id": "m1", "role": "user", "content": "Hi"}),
            json!({"id": "t1-1", "role": "assistant", "content": "Hello"}),
            json!({"id": "m2", "role": "user", "content": "Tell a story"}),
        ];
        if let Some(answer) = answer {
            messages.push(json!({"id": "t2-1", "role": "assistant", "content": answer}));
        }
        messages.push(json!({"id": "m3", "role": "user", "content": "Go on"}));
        input(json!(messages), json!({})).unwrap()
    };
    // All of it, or any beginning of it (the deltas the client got before
    // the cut): the next message goes on.
    let go_on = ("m3".to_owned(), "Go on".to_owned());
    for kept in [Some("Once upon"), Some("Once"), Some("")] {
        let planned = plan(&with(kept), &thread).unwrap_or_else(|error| panic!("{open} {kept:?}: {error:?}"));
        assert_eq!(planned.user_messages, std::slice::from_ref(&go_on), "{kept:?}");
    }
    // None of it: the question before is sent again under its key (the
    // same submission, as a retried run's is), then the next message.
    let resent = plan(&with(None), &thread).unwrap();
    assert_eq!(
        resent.user_messages,
        [("m2".to_owned(), "Tell a story".to_owned()), go_on]
    );
    // Text the session never streamed is still a fork.
    assert!(matches!(
        plan(&with(Some("Once upon a time")), &thread),
        Err(InputError::HistoryMismatch(message)) if message.contains("message 5")
    ));
    // A complete answer is compared whole, as before.
    let mut cut_short = with(Some("Once upon"));
    cut_short.messages[1] = input(
        json!([{"id": "t1-1", "role": "assistant", "content": "Hell"}]),
        json!({}),
    )
    .unwrap()
    .messages
    .remove(0);
    assert!(matches!(plan(&cut_short, &thread), Err(InputError::HistoryMismatch(_))));
}
