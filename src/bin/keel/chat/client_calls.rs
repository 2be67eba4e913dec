//! Answering the calls of the chat's client tools (`--client-tool`): when
//! the log shows `client_tool_requested` for one of them, the chat runs it
//! (or asks the user) and sends a `client_tool_result` op, printing what it
//! sent.

use std::collections::HashSet;

use keel::protocol::{ClientToolRequestedEvent, EventMsg, RecordedEvent};

use super::Chat;
use super::client_tools::{Answer, Call, call, user_answer};
use super::input::Read;
use crate::console::shorten;
use crate::terminal::terminal_safe;

/// How a call was dealt with.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Answered {
    /// Its result was sent (or it is another client's to answer).
    Done,
    /// The user pressed Ctrl-C at the question: the turn is to be
    /// interrupted.
    Interrupted,
}

impl Chat {
    /// Runs the client tool `request` calls, if it is one of this chat's,
    /// and sends its result.
    pub(super) async fn answer_client_tool(&mut self, request: &ClientToolRequestedEvent) -> anyhow::Result<Answered> {
        let name = terminal_safe(&request.name).into_owned();
        let answer = match call(&self.args.client_tools, request) {
            None => {
                self.render
                    .note(&format!("[client tool {name}: waiting for another client to answer]"))?;
                return Ok(Answered::Done);
            }
            Some(Call::Answer(answer)) => answer,
            Some(Call::Ask(question)) => {
                self.render.stop_spinner();
                self.render.end_line()?;
                let prompt = format!("? {} ", terminal_safe(&question.replace('\n', " ")));
                let read = tokio::select! {
                    read = self.input.question(&prompt, &mut self.interrupts) => read?,
                    // As Ctrl-C at the question: the turn is interrupted.
                    _ = self.terminations.next() => Read::Interrupted,
                };
                match read {
                    Read::Line(text) => user_answer(Some(text)),
                    Read::Eof => user_answer(None),
                    Read::Interrupted => return Ok(Answered::Interrupted),
                }
            }
        };
        self.send_client_result(request, answer).await?;
        Ok(Answered::Done)
    }

    /// Sends `answer` for `request`, after printing it.
    async fn send_client_result(&mut self, request: &ClientToolRequestedEvent, answer: Answer) -> anyhow::Result<()> {
        let op = answer.op(request);
        if let keel::protocol::Op::ClientToolResult { output, is_error, .. } = &op {
            let label = if *is_error { "error" } else { "result" };
            self.render.note(&format!(
                "[client tool {} {label}: {}]",
                request.name,
                shorten(output, 200)
            ))?;
        }
        self.session.control(op).await?;
        self.render.waiting();
        Ok(())
    }
}

/// The client tool calls in `history` still waiting for a result: asked,
/// not completed, in a turn that has not ended.
pub(super) fn waiting_calls<'a>(history: impl IntoIterator<Item = &'a RecordedEvent>) -> Vec<ClientToolRequestedEvent> {
    let mut waiting: Vec<ClientToolRequestedEvent> = Vec::new();
    let mut ended: HashSet<&str> = HashSet::new();
    for event in history {
        match &event.msg {
            EventMsg::ClientToolRequested(request) => waiting.push(request.clone()),
            EventMsg::ToolCallCompleted(done) => waiting.retain(|request| request.call_id != done.call_id),
            msg if msg.ends_turn() => {
                if let Some(turn) = msg.turn_id() {
                    ended.insert(turn);
                }
            }
            _ => {}
        }
    }
    waiting.retain(|request| !ended.contains(request.turn_id.as_str()));
    waiting
}

#[cfg(test)]
mod tests {
    use super::waiting_calls;
    use keel::protocol::{
        AbortReason, ClientToolRequestedEvent, Event, EventMsg, RecordedEvent, ToolCallCompletedEvent, TurnAbortedEvent,
    };

    fn recorded(sequence: u64, msg: EventMsg) -> RecordedEvent {
        RecordedEvent {
            sequence,
            recorded_at_ms: 0,
            event: Event {
                submission_id: None,
                msg,
            },
        }
    }

    fn requested(turn: &str, call: &str) -> EventMsg {
        EventMsg::ClientToolRequested(ClientToolRequestedEvent {
            turn_id: turn.into(),
            call_id: call.into(),
            name: "echo".into(),
            arguments: "{}".into(),
            expires_at_ms: None,
        })
    }

    #[test]
    fn only_calls_without_a_result_in_an_open_turn_wait() {
        let completed = EventMsg::ToolCallCompleted(ToolCallCompletedEvent {
            turn_id: "t1".into(),
            call_id: "a".into(),
            output: "x".into(),
            is_error: false,
        });
        let aborted = EventMsg::TurnAborted(TurnAbortedEvent {
            turn_id: "t1".into(),
            reason: AbortReason::Interrupted,
            message: String::new(),
        });
        let history = [
            recorded(1, requested("t1", "a")),
            recorded(2, completed),
            recorded(3, requested("t1", "b")),
            recorded(4, aborted),
            recorded(5, requested("t2", "c")),
            recorded(6, requested("t2", "d")),
        ];
        let calls: Vec<String> = waiting_calls(&history).into_iter().map(|call| call.call_id).collect();
        assert_eq!(calls, ["c", "d"]);
    }
}
