//! Budgets through a real `keel serve` whose model is the OpenAI-compatible
//! test server reporting usage: a spent budget ends the running turn with
//! `budget_exhausted` before its next model step, a new message is `429`
//! naming the budget and when it resets, budgets survive a restart, and the
//! next day's window opens again (a moved clock).

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::suite::support::api::{Api, Reply, Resume, metric};
use crate::suite::support::events::{ends_turn, kinds};
use crate::suite::support::http_server::{Reply as Upstream, ScriptedServer};
use crate::suite::support::server::{Scratch, ServeProcess, slow_chunks};
use keel::protocol::{AbortReason, EventMsg, RecordedEvent};

/// Tokens each scripted step reports: 100 in, 20 out.
pub(crate) const STEP_INPUT: u64 = 100;
pub(crate) const STEP_OUTPUT: u64 = 20;

/// An OpenAI chat completion that asks for the clock, with usage.
pub(crate) fn clock_call(index: usize) -> Upstream {
    let chunk = |choices: Value, usage: Value| {
        let chunk = json!({
            "id": "chatcmpl-budget", "object": "chat.completion.chunk", "created": 1_767_225_600,
            "model": "gpt-4.1-mini", "choices": choices, "usage": usage,
        });
        format!("data: {chunk}\n\n")
    };
    let call = json!([{"index": 0, "delta": {"role": "assistant", "content": null, "tool_calls": [{
        "index": 0, "id": format!("call_{index}"), "type": "function",
        "function": {"name": "clock", "arguments": "{}"},
    }]}, "finish_reason": null}]);
    let body = chunk(call, Value::Null)
        + &chunk(
            json!([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]),
            Value::Null,
        )
        + &chunk(
            json!([]),
            json!({"prompt_tokens": STEP_INPUT, "completion_tokens": STEP_OUTPUT, "total_tokens": STEP_INPUT + STEP_OUTPUT}),
        )
        + "data: [DONE]\n\n";
    Upstream::sse_in_pieces(body.as_bytes(), 1 << 16)
}

/// A provider whose every answer is another clock call.
pub(crate) async fn looping_provider(steps: usize) -> ScriptedServer {
    ScriptedServer::start((0..steps).map(clock_call).collect()).await
}

/// `keel serve` on `scratch` with the provider as `openai:`, and `args`.
fn serve(scratch: &Scratch, provider: &ScriptedServer, args: &[&str]) -> ServeProcess {
    let mut command = ServeProcess::command(scratch, args);
    command
        .env("OPENAI_API_KEY", "sk-test-budgets")
        .env("OPENAI_BASE_URL", provider.url() + "/v1");
    ServeProcess::spawn(command)
}

async fn put(api: &Api, path: &str, body: Value) -> Reply {
    api.send(api.client.put(api.url(path)).json(&body)).await
}

async fn delete(api: &Api, path: &str) -> Reply {
    api.send(api.client.delete(api.url(path))).await
}

/// A session of `tenant` on the provider's model, with the clock tool.
async fn create(api: &Api, id: &str, tenant: &str) {
    let tools = json!({"builtin": true, "write": false, "shell": false});
    api.create(json!({"id": id, "tenant": tenant, "model": "openai:gpt-4.1-mini", "tools": tools}))
        .await;
}

/// Sends a message and reads its turn to the end.
async fn turn(api: &Api, id: &str, text: &str) -> Vec<RecordedEvent> {
    let after = api.session(id).await["last_sequence"].as_u64().expect("sequence");
    let mut stream = api.stream(id, Resume::After(after)).await;
    api.say(id, text).await;
    stream.until(ends_turn).await
}

fn steps(events: &[RecordedEvent]) -> usize {
    kinds(events)
        .iter()
        .filter(|kind| **kind == "model_step_started")
        .count()
}

fn aborted_for_budget(events: &[RecordedEvent]) -> bool {
    matches!(
        events.last().map(|event| &event.msg),
        Some(EventMsg::TurnAborted(aborted)) if aborted.reason == AbortReason::BudgetExhausted
    )
}

async fn message(api: &Api, id: &str, text: &str) -> Reply {
    api.submit(id, json!({"op": {"type": "user_input", "text": text}}))
        .await
}

fn exhausted_count(metrics: &str, tenant: &str) -> f64 {
    metric(metrics, &format!("keel_budget_exhausted_total{{tenant=\"{tenant}\"}}")).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_daily_budget_ends_the_turn_refuses_messages_survives_a_restart_and_reopens_the_next_day() {
    let scratch = Scratch::new();
    let provider = looping_provider(12).await;
    let server = serve(&scratch, &provider, &[]);
    let api = &server.api;
    create(api, "spender", "acme").await;
    let other = scratch.script("other.jsonl", &[r#"{"text": "hello"}"#]);
    api.create(json!({"id": "other", "tenant": "globex", "model": other}))
        .await;
    // Room for two steps and a half: the third step spends it.
    let set = put(api, "/v1/tenants/acme/budget", json!({"total_tokens_per_day": 300})).await;
    assert_eq!(set.status, StatusCode::OK, "{}", set.body);
    assert_eq!(set.body["source"], "api");
    assert_eq!(set.body["budget"], json!({"total_tokens_per_day": 300}));
    assert_eq!(set.body["exhausted"], Value::Null);

    let events = turn(api, "spender", "loop").await;
    assert!(aborted_for_budget(&events), "{:?}", kinds(&events));
    assert_eq!(
        steps(&events),
        3,
        "stopped before the fourth step: {:?}",
        kinds(&events)
    );
    assert_eq!(provider.requests().len(), 3, "the model was not called again");

    let refused = message(api, "spender", "more").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{}", refused.body);
    assert_eq!(refused.code(), "budget_exhausted");
    let budget = &refused.body["error"]["budget"];
    assert_eq!(budget["applies_to"], "tenant");
    assert_eq!(budget["tenant"], "acme");
    assert_eq!(budget["limit"], "total_tokens_per_day");
    assert_eq!(budget["allowed"], 300);
    assert_eq!(budget["used"], 3 * (STEP_INPUT + STEP_OUTPUT));
    // The hour the usage was recorded in leaves the window a day later.
    let now = keel::protocol::now_ms();
    let hour = 3_600_000;
    let resets = budget["resets_at_ms"].as_u64().expect("a reset time");
    assert!(
        resets > now && resets <= now - now % hour + 24 * hour,
        "{resets} vs {now}"
    );
    // An interrupt is never refused.
    let interrupt = api.submit("spender", json!({"op": {"type": "interrupt"}})).await;
    assert_eq!(interrupt.status, StatusCode::ACCEPTED, "{}", interrupt.body);

    let shown = api.get("/v1/tenants/acme/budget").await;
    assert_eq!(shown.body["spend"]["day"]["total_tokens"], 360, "{}", shown.body);
    assert_eq!(shown.body["spend"]["all_time"]["total_tokens"], 360);
    assert_eq!(shown.body["exhausted"]["limit"], "total_tokens_per_day");
    assert_eq!(shown.body["running_turns"], 0);
    // The stopped turn and the refused message.
    assert_eq!(exhausted_count(&api.metrics().await, "acme"), 2.0);
    // Another tenant is untouched.
    let events = turn(api, "other", "hi").await;
    assert_eq!(kinds(&events).last(), Some(&"turn_complete"), "{:?}", kinds(&events));
    assert_eq!(exhausted_count(&api.metrics().await, "globex"), 0.0);
    let (status, _) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .expect("terminate");
    assert!(status.success());

    // Budget and usage are in the store: a restarted server refuses too.
    let server = serve(&scratch, &provider, &[]);
    let refused = message(&server.api, "spender", "after the restart").await;
    assert_eq!(refused.code(), "budget_exhausted", "{}", refused.body);
    let (status, _) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .expect("terminate");
    assert!(status.success());

    // A day and an hour later, yesterday's buckets have left the window.
    let server = serve(&scratch, &provider, &["--test-clock-offset-secs", "90000"]);
    let shown = server.api.get("/v1/tenants/acme/budget").await;
    assert_eq!(shown.body["spend"]["day"]["total_tokens"], 0, "{}", shown.body);
    assert_eq!(shown.body["spend"]["all_time"]["total_tokens"], 360);
    // The daily limit no longer refuses; an all-time one set beside it
    // (the ledger's total does not move with the clock) stops the turn
    // after one more step.
    let both = json!({"total_tokens_per_day": 300, "total_tokens": 480});
    let set = put(&server.api, "/v1/tenants/acme/budget", both).await;
    assert_eq!(set.body["exhausted"], Value::Null, "{}", set.body);
    let events = turn(&server.api, "spender", "a new day").await;
    assert!(aborted_for_budget(&events), "{:?}", kinds(&events));
    assert_eq!(steps(&events), 1, "the all-time room, and no more");
    assert_eq!(provider.requests().len(), 4);
    let refused = message(&server.api, "spender", "more").await;
    let budget = &refused.body["error"]["budget"];
    assert_eq!(
        (&budget["limit"], &budget["used"], &budget["resets_at_ms"]),
        (&json!("total_tokens"), &json!(480), &Value::Null),
        "{}",
        refused.body
    );
    // Removing the API's budget leaves none (keel.toml has none).
    let removed = delete(&server.api, "/v1/tenants/acme/budget").await;
    assert_eq!(removed.status, StatusCode::NO_CONTENT, "{}", removed.body);
    let none = server.api.get("/v1/tenants/acme/budget").await;
    assert_eq!(none.status, StatusCode::NOT_FOUND, "{}", none.body);
    let accepted = message(&server.api, "spender", "free again").await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED, "{}", accepted.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_budget_spares_its_neighbours_and_the_concurrency_cap_refuses_a_new_turn() {
    let scratch = Scratch::new();
    let provider = looping_provider(12).await;
    // keel.toml caps the default tenant's turns at one at a time.
    std::fs::write(
        scratch.dir.path().join("keel.toml"),
        "[tenants.default.budget]\nmax_concurrent_turns = 1\n",
    )
    .expect("keel.toml");
    let server = serve(&scratch, &provider, &["--config", "keel.toml"]);
    let api = &server.api;
    create(api, "capped", "default").await;
    create(api, "free", "default").await;
    // A budget with no limit, or a null one, is refused: DELETE removes one.
    for empty in [json!({}), json!({"output_tokens": null})] {
        let refused = put(api, "/v1/sessions/capped/budget", empty).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.body);
    }
    let set = put(api, "/v1/sessions/capped/budget", json!({"output_tokens": 30.0})).await;
    assert_eq!(set.status, StatusCode::OK, "{}", set.body);
    assert_eq!(set.body["session_id"], "capped");
    assert_eq!(set.body["source"], "api");
    let tenant = api.get("/v1/tenants/default/budget").await;
    assert_eq!(tenant.body["source"], "config", "{}", tenant.body);
    assert_eq!(tenant.body["budget"], json!({"max_concurrent_turns": 1}));

    let events = turn(api, "capped", "loop").await;
    assert!(aborted_for_budget(&events), "{:?}", kinds(&events));
    assert_eq!(steps(&events), 2, "20 then 40 output tokens of 30");
    let refused = message(api, "capped", "more").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{}", refused.body);
    let budget = &refused.body["error"]["budget"];
    assert_eq!(
        (
            &budget["applies_to"],
            &budget["session_id"],
            &budget["limit"],
            &budget["resets_at_ms"]
        ),
        (
            &json!("session"),
            &json!("capped"),
            &json!("output_tokens"),
            &Value::Null
        )
    );
    assert_eq!(budget["used"], 40);

    // Its neighbour has no budget of its own; its turn runs while a
    // scripted slow turn keeps the tenant's one turn busy.
    let model = scratch.script("slow.jsonl", &[&slow_chunks(100, 30), r#"{"text": "done"}"#]);
    api.create(json!({"id": "slow", "model": model})).await;
    let mut stream = api.stream("slow", Resume::Start).await;
    api.say("slow", "take your time").await;
    stream
        .until(|event| event.msg.kind() == "assistant_content_delta")
        .await;
    let refused = message(api, "free", "me too").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{}", refused.body);
    let budget = &refused.body["error"]["budget"];
    assert_eq!(
        (
            &budget["limit"],
            &budget["allowed"],
            &budget["used"],
            &budget["resets_at_ms"]
        ),
        (&json!("max_concurrent_turns"), &json!(1), &json!(1), &Value::Null)
    );
    // A message for the busy session itself waits in its queue.
    let queued = message(api, "slow", "after that").await;
    assert_eq!(queued.status, StatusCode::ACCEPTED, "{}", queued.body);
    stream.until(|event| event.msg.kind() == "turn_complete").await;
    stream.until(|event| event.msg.kind() == "turn_complete").await;
    let accepted = message(api, "free", "now").await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED, "{}", accepted.body);

    // Removing the session's budget lets it run again.
    let removed = delete(api, "/v1/sessions/capped/budget").await;
    assert_eq!(removed.status, StatusCode::NO_CONTENT, "{}", removed.body);
    let none = api.get("/v1/sessions/capped/budget").await;
    assert_eq!(none.status, StatusCode::NOT_FOUND, "{}", none.body);
    api.wait_idle("free").await;
    let again = message(api, "capped", "again").await;
    assert_eq!(again.status, StatusCode::ACCEPTED, "{}", again.body);
    let missing = api.get("/v1/sessions/nobody/budget").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
}

/// The sessions whose submissions of a burst were admitted, checking that
/// every other was refused (`429`) for the tenant's `cap` concurrent turns.
pub(crate) fn admitted_up_to_the_cap<'a>(sessions: &'a [String], replies: &[Reply], cap: u64) -> Vec<&'a String> {
    for reply in replies.iter().filter(|reply| reply.status != StatusCode::ACCEPTED) {
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{}", reply.body);
        let budget = &reply.body["error"]["budget"];
        assert_eq!(budget["limit"], "max_concurrent_turns", "{}", reply.body);
        assert_eq!(budget["used"], cap, "{}", reply.body);
    }
    sessions
        .iter()
        .zip(replies)
        .filter(|(_, reply)| reply.status == StatusCode::ACCEPTED)
        .map(|(id, _)| id)
        .collect()
}

/// `max_concurrent_turns` is exact under a burst: submissions to ten idle
/// sessions of one tenant, sent at once, are admitted two (the cap) and
/// refused eight, however they interleave, and never more turns run at
/// once; once those end their slots are free again. Before the admission
/// took a slot in the store, all ten were `202` and all ran at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_submissions_to_idle_sessions_is_admitted_up_to_the_cap_exactly() {
    let scratch = Scratch::new();
    std::fs::write(
        scratch.dir.path().join("keel.toml"),
        "[tenants.acme.budget]\nmax_concurrent_turns = 2\n",
    )
    .expect("keel.toml");
    let server = ServeProcess::start(&scratch, &["--config", "keel.toml"]);
    let api = &server.api;
    let sessions: Vec<String> = (0..10).map(|index| format!("burst-{index}")).collect();
    for (index, id) in sessions.iter().enumerate() {
        // One slow answer per round: a script run dry would end a turn at
        // once and give its slot back while the burst is still arriving.
        let slow = slow_chunks(20, 50);
        let model = scratch.script(&format!("slow-{index}.jsonl"), &[&slow, &slow]);
        api.create(json!({"id": id, "tenant": "acme", "model": model})).await;
    }
    for round in 0..2 {
        let replies = futures::future::join_all(
            sessions
                .iter()
                .map(|id| message(api, id, if round == 0 { "go" } else { "again" })),
        )
        .await;
        let accepted = admitted_up_to_the_cap(&sessions, &replies, 2);
        assert_eq!(accepted.len(), 2, "round {round}: admitted {accepted:?}");
        let running = api.get("/v1/tenants/acme/budget").await;
        assert!(
            running.body["running_turns"].as_u64().is_some_and(|held| held <= 2),
            "{}",
            running.body
        );
        for id in &accepted {
            api.wait_idle(id).await;
        }
        // Given back as the turns end: the next round is admitted afresh.
        crate::suite::support::wait::wait_until_async(
            "the slots to be given back",
            crate::suite::support::wait::HANG_GUARD,
            async || api.get("/v1/tenants/acme/budget").await.body["running_turns"] == 0,
        )
        .await;
    }
}
