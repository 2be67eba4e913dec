//! Webhooks on several nodes: every node delivers, one at a time per
//! session, and when the node holding a delivery is killed another takes
//! it over once its claim runs out. Judged by the same receiver as on
//! SQLite (the Standard Webhooks reference library), approving through
//! the node that survives.

use std::collections::HashMap;

use keel::protocol::{AbortReason, EventMsg};
use reqwest::StatusCode;
use serde_json::json;

use super::{Cluster, SHORT_LEASE_MS, assert_log_sound};
use crate::suite::server::webhooks::{
    Receiver, SECRET, SECRET_ENV, all_idle, approval_requests, approval_script, judge, keel_toml,
};
use crate::suite::support::python::venv_python;
use crate::suite::support::server::ServeProcess;
use crate::suite::support::wait::{HANG_GUARD, wait_until_async};
use keel::store::postgres::local::LocalPostgres;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_nodes_deliveries_are_taken_over_and_arrive_once_each_in_order() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    let Some(python) = venv_python("suite::server::cluster::webhooks") else {
        return;
    };
    let mut cluster = Cluster::start(postgres, 0, SHORT_LEASE_MS, &[]);
    // The receiver approves through node 1, which lives (its address is
    // written once it listens); node 0 runs the sessions and is killed.
    let keel_url = cluster.scratch.dir.path().join("keel-url");
    std::fs::write(&keel_url, "").expect("write the URL file");
    let receiver = Receiver::start(
        &python,
        cluster.scratch.dir.path(),
        SECRET,
        &keel_url.display().to_string(),
        20,
    );
    std::fs::write(
        cluster.scratch.dir.path().join("keel.toml"),
        keel_toml(&receiver.url(), &["approval_requested", "turn_complete"]),
    )
    .expect("keel.toml");
    for index in 0..2 {
        let mut command = cluster.command(index, &["--config", "keel.toml"]);
        command.env(SECRET_ENV, SECRET);
        cluster.nodes.push(Some(ServeProcess::spawn(command)));
    }
    std::fs::write(&keel_url, &cluster.api(1).base).expect("write the URL file");
    let model = approval_script(&cluster.scratch, 20);
    let sessions: Vec<String> = (0..4).map(|n| format!("noded-{n}")).collect();
    for session in &sessions {
        cluster
            .api(0)
            .create(json!({"id": session, "model": model, "tools": {"shell": false},
                "approvals": {"default": "ask"}, "queue_mode": "each"}))
            .await;
        for message in 0..5 {
            let reply = cluster
                .api(0)
                .submit(
                    session,
                    json!({"op": {"type": "user_input", "text": format!("write {message}")}}),
                )
                .await;
            assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
        }
    }
    // Node 0 dies mid-way; node 1 takes the sessions and the deliveries.
    wait_until_async("some approvals to arrive", HANG_GUARD, async || {
        receiver.entries().len() >= 4
    })
    .await;
    let killed = cluster.take(0);
    tokio::task::spawn_blocking(move || killed.crash())
        .await
        .expect("kill node 0");
    let api = cluster.api(1).clone();
    all_idle(&api, &sessions, &receiver).await;
    let mut logs = HashMap::new();
    for session in &sessions {
        let log = cluster.log(session).await;
        assert_log_sound(&log);
        logs.insert(session.clone(), log);
    }
    // Each session ran its five turns. The kill cut at most the one in
    // flight on node 0 (a turn waiting for its approval is not cut: it
    // waits through the kill). Every other turn asked for its approval,
    // but for one after a cut: the script's answers are one a step, and
    // the cut turn left its last answer to the next turn.
    for (session, log) in &logs {
        let (mut turns, mut cut, mut silent, mut asked) = (0, 0, 0, false);
        for event in log {
            match &event.msg {
                EventMsg::TurnStarted(_) => (turns, asked) = (turns + 1, false),
                EventMsg::ApprovalRequested(_) => asked = true,
                EventMsg::TurnAborted(aborted) if aborted.reason == AbortReason::RuntimeStopped => cut += 1,
                EventMsg::TurnComplete(_) | EventMsg::TurnAborted(_) if !asked => silent += 1,
                _ => {}
            }
        }
        assert_eq!(turns, 5, "{session}: {log:#?}");
        assert!(cut <= 1, "{session}: the kill cut {cut} turns");
        assert!(
            silent <= cut,
            "{session}: {silent} turns did not ask, {cut} cut: {log:#?}"
        );
    }
    let asked = approval_requests(&logs).len();
    wait_until_async("every delivery to be delivered", HANG_GUARD, async || {
        let reply = api.get("/v1/webhooks/judge/deliveries?state=pending").await;
        reply.status == StatusCode::OK && reply.body["deliveries"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    // A turn cut after it was approved does not complete: one per session
    // at most.
    judge(&receiver.entries(), &logs, asked, sessions.len());
}
