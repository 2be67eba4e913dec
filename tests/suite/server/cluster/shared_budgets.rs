//! Across two nodes: who sent a relayed submission is recorded by the
//! owner as the node that took the request saw it (sealed with it), and a
//! budget spent through both nodes at once is overspent by at most the
//! step each running turn was taking.

use std::time::Duration;

use keel::protocol::{AbortReason, Actor, EventMsg, RecordedEvent};
use keel::store::postgres::local::LocalPostgres;
use reqwest::StatusCode;
use serde_json::json;

use super::{Cluster, SHORT_LEASE_MS, stream_until};
use crate::suite::server::budgets::{STEP_INPUT, STEP_OUTPUT, looping_provider};
use crate::suite::support::api::Resume;
use crate::suite::support::http_server::ScriptedServer;
use crate::suite::support::server::ServeProcess;
use crate::suite::support::wait::{HANG_GUARD, wait_until_async};

/// Starts `count` nodes with `extra` arguments, the provider as `openai:`.
fn start_nodes(cluster: &mut Cluster, count: usize, provider: Option<&ScriptedServer>, extra: &[&str]) {
    for index in 0..count {
        let mut command = cluster.command(index, extra);
        if let Some(provider) = provider {
            command
                .env("OPENAI_API_KEY", "sk-test-shared-budgets")
                .env("OPENAI_BASE_URL", provider.url() + "/v1");
        }
        cluster.nodes.push(Some(ServeProcess::spawn(command)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_submission_and_decision_record_who_sent_them() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    let mut cluster = Cluster::start(postgres, 0, SHORT_LEASE_MS, &[]);
    // With a token the relayed rows are sealed, the principal with them.
    let token = "cluster-token-of-the-audit-test-0123456789";
    let token_file = cluster.scratch.dir.path().join("token");
    std::fs::write(&token_file, token).expect("token file");
    let token_path = token_file.display().to_string();
    start_nodes(&mut cluster, 2, None, &["--token-file", &token_path]);
    for node in cluster.nodes.iter_mut().flatten() {
        node.api.token = Some(token.to_owned());
    }
    let call =
        json!({"tool_calls": [{"id": "w", "name": "write_file", "arguments": {"path": "w.txt", "content": "w"}}]});
    let model = cluster
        .scratch
        .script("ask.jsonl", &[&call.to_string(), r#"{"text": "written"}"#]);
    cluster
        .api(0)
        .create(json!({"id": "relayed", "model": model, "tools": {"shell": false}, "approvals": {"default": "ask"}}))
        .await;
    let mut watch = cluster.api(0).stream("relayed", Resume::Start).await;
    // Node 1 does not run the session: both are relayed to node 0.
    cluster.api(1).say("relayed", "write it").await;
    stream_until(&mut watch, Duration::from_secs(30), |event| {
        event.msg.kind() == "approval_requested"
    })
    .await;
    let decision = json!({"op": {"type": "approval", "call_id": "w", "decision": "approve"}});
    let reply = cluster.api(1).submit("relayed", decision).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    stream_until(&mut watch, Duration::from_secs(30), |event| {
        event.msg.kind() == "turn_complete"
    })
    .await;
    let relayed = cluster.api(1).metrics().await;
    assert!(
        super::counter(&relayed, "keel_relayed_submissions_total") >= 2.0,
        "both went through the database: {relayed}"
    );
    let log = cluster.log("relayed").await;
    let operator = || Some(Actor::operator("default"));
    let queued: Vec<_> = log
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::SubmissionQueued(queued) => Some(queued.submitted_by.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(queued, [operator()]);
    let decided: Vec<_> = log
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::ApprovalDecided(decided) => Some(decided.decided_by.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(decided, [operator()]);
}

/// The tokens a turn's `token_usage` events add up to.
fn spent(log: &[RecordedEvent]) -> u64 {
    log.iter()
        .filter_map(|event| match &event.msg {
            EventMsg::TokenUsage(usage) => Some(usage.usage.input_tokens + usage.usage.output_tokens),
            _ => None,
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_spent_through_two_nodes_at_once_is_overspent_by_at_most_a_step_per_turn() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    let provider = looping_provider(60).await;
    let mut cluster = Cluster::start(postgres, 0, SHORT_LEASE_MS, &[]);
    start_nodes(&mut cluster, 2, Some(&provider), &[]);
    let step = STEP_INPUT + STEP_OUTPUT;
    let limit = 10 * step + step / 2;
    // A session on each node.
    for (index, id) in [(0, "east"), (1, "west")] {
        cluster
            .api(index)
            .create(json!({"id": id, "model": "openai:gpt-4.1-mini", "tools": {"builtin": true, "write": false, "shell": false}}))
            .await;
    }
    let set = cluster
        .api(0)
        .send(
            cluster
                .api(0)
                .client
                .put(cluster.api(0).url("/v1/tenants/default/budget"))
                .json(&json!({"total_tokens_per_day": limit})),
        )
        .await;
    assert_eq!(set.status, StatusCode::OK, "{}", set.body);
    // The other node reads it from the store within its poll.
    wait_until_async("the budget to reach node 1", HANG_GUARD, async || {
        cluster.api(1).get("/v1/tenants/default/budget").await.body["source"] == "api"
    })
    .await;

    let mut streams = Vec::new();
    for (index, id) in [(0, "east"), (1, "west")] {
        streams.push((index, id, cluster.api(index).stream(id, Resume::Start).await));
    }
    // Both turns run at once, each on its own node.
    for (index, id) in [(0, "east"), (1, "west")] {
        cluster.api(index).say(id, "loop").await;
    }
    let mut total = 0;
    for (_, id, stream) in &mut streams {
        let events = stream_until(stream, Duration::from_secs(60), |event| {
            event.msg.kind() == "turn_aborted" || event.msg.kind() == "turn_complete"
        })
        .await;
        assert!(
            matches!(
                &events.last().map(|event| &event.msg),
                Some(EventMsg::TurnAborted(aborted)) if aborted.reason == AbortReason::BudgetExhausted
            ),
            "{id}: {:?}",
            events.last()
        );
        total += spent(&cluster.log(id).await);
    }
    assert!(total >= limit, "the budget was spent: {total} of {limit}");
    assert!(
        total < limit + 2 * step,
        "overspent by at most a step per running turn: {total} of {limit} (steps of {step})"
    );
    // Every node refuses the next message, and says the same.
    for (index, id) in [(0, "west"), (1, "east")] {
        let refused = cluster
            .api(index)
            .submit(id, json!({"op": {"type": "user_input", "text": "more"}}))
            .await;
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{}", refused.body);
        assert_eq!(refused.body["error"]["budget"]["used"], total, "{}", refused.body);
    }
}

/// `max_concurrent_turns` holds across nodes under a burst: six idle
/// sessions of one tenant, each sent a message at once through one node
/// or the other, with a cap of one: exactly one is admitted, whichever
/// node took it (before the slot was taken in the store, six of six ran).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_concurrency_cap_admits_exactly_its_turns_from_a_burst_on_two_nodes() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    let mut cluster = Cluster::start(postgres, 0, SHORT_LEASE_MS, &[]);
    let config = cluster.scratch.dir.path().join("keel.toml");
    std::fs::write(&config, "[tenants.acme.budget]\nmax_concurrent_turns = 1\n").expect("keel.toml");
    let config = config.display().to_string();
    start_nodes(&mut cluster, 2, None, &["--config", &config]);
    let sessions: Vec<String> = (0..6).map(|index| format!("capped-{index}")).collect();
    for (index, id) in sessions.iter().enumerate() {
        // One slow answer per round (see the single-node burst test).
        let slow = crate::suite::support::server::slow_chunks(20, 50);
        let model = cluster.scratch.script(&format!("slow-{index}.jsonl"), &[&slow, &slow]);
        // Half made on each node: each node runs some of them.
        cluster
            .api(index % 2)
            .create(json!({"id": id, "tenant": "acme", "model": model}))
            .await;
    }
    for round in 0..2 {
        let replies = futures::future::join_all(sessions.iter().enumerate().map(|(index, id)| {
            let api = cluster.api((index + round) % 2).clone();
            let id = id.clone();
            async move {
                api.submit(&id, json!({"op": {"type": "user_input", "text": "go"}}))
                    .await
            }
        }))
        .await;
        let accepted = crate::suite::server::budgets::admitted_up_to_the_cap(&sessions, &replies, 1);
        assert_eq!(accepted.len(), 1, "round {round}: admitted {accepted:?}");
        for id in &accepted {
            wait_until_async("the admitted turn to end", HANG_GUARD, async || {
                let view = cluster.api(0).session(id).await;
                view["state"] == "idle" && view["queued"] == 0
            })
            .await;
        }
        wait_until_async("the slot to be given back", HANG_GUARD, async || {
            cluster.api(1).get("/v1/tenants/acme/budget").await.body["running_turns"] == 0
        })
        .await;
    }
}
