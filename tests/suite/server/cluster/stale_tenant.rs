//! A node checks a submission's tenant against what it knows of the
//! session without reading the store (the owner's lease it learnt, with the
//! session's tenant). That can be stale: the session deleted and made again
//! under the same id for another tenant while the lease it learnt lasts.
//! The owner checks the tenant again, so the old tenant's key still gets
//! the answer of a session that does not exist, and queues nothing.

use reqwest::StatusCode;
use serde_json::json;

use super::{Cluster, assert_log_sound};
use crate::suite::support::api::{Api, Resume};
use crate::suite::support::wait::{HANG_GUARD, guard, wait_until_async};
use keel::store::postgres::local::LocalPostgres;

const OPERATOR: &str = "operator-token-of-the-stale-tenant-test";

/// `api` with the credentials `token`.
fn as_holder(api: &Api, token: &str) -> Api {
    Api {
        token: Some(token.to_owned()),
        ..api.clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_learnt_from_a_lease_that_went_stale_queues_nothing() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    let scratch_token = tempfile::NamedTempFile::new().expect("a token file");
    std::fs::write(scratch_token.path(), OPERATOR).expect("write the token");
    let token_file = scratch_token.path().to_str().expect("utf-8").to_owned();
    // Leases far longer than the test: what node 1 learns stays its hint.
    let cluster = Cluster::start(postgres, 2, 60_000, &["--token-file", &token_file]);
    let answers = [r#"{"text": "One."}"#, r#"{"text": "Two."}"#, r#"{"text": "Three."}"#];
    let model = cluster.scratch.script("t.jsonl", &answers);
    let operator = [as_holder(cluster.api(0), OPERATOR), as_holder(cluster.api(1), OPERATOR)];

    operator[0]
        .create(json!({"id": "t", "model": model, "tenant": "acme"}))
        .await;
    let made = operator[0]
        .post(
            "/v1/keys",
            &json!({"tenant": "acme", "name": "acme", "scopes": ["read", "submit"]}),
        )
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let key = made.body["key"].as_str().expect("the key").to_owned();
    let acme = [as_holder(cluster.api(0), &key), as_holder(cluster.api(1), &key)];
    wait_until_async("the key to work on node 1", HANG_GUARD, async || {
        acme[1].get("/v1/whoami").await.status == StatusCode::OK
    })
    .await;

    // Node 0 runs the session; node 1 relays to it and learns its tenant.
    let mut watch = operator[0].stream("t", Resume::Start).await;
    acme[0].say("t", "on the owner").await;
    guard("the first turn", watch.turns(1)).await;
    acme[1].say("t", "relayed").await;
    guard("the relayed turn", watch.turns(1)).await;
    drop(watch);

    // The session is deleted and made again under its id for another tenant.
    let deleted = operator[0]
        .send(operator[0].client.delete(operator[0].url("/v1/sessions/t")))
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.body);
    operator[0]
        .create(json!({"id": "t", "model": model, "tenant": "globex"}))
        .await;
    operator[0].say("t", "globex's own").await;
    operator[0].wait_idle("t").await;

    // acme's key is answered as for a session that does not exist, on both
    // nodes, and nothing of it reaches globex's session.
    let absent = acme[1]
        .submit("nothing-here", json!({"op": {"type": "user_input", "text": "x"}}))
        .await;
    for api in [&acme[1], &acme[0]] {
        let reply = api
            .submit("t", json!({"op": {"type": "user_input", "text": "from acme"}}))
            .await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.body);
        assert_eq!(reply.code(), "not_found");
        let expected = absent.body["error"]["message"]
            .as_str()
            .map(|text| text.replace("nothing-here", "t"));
        assert_eq!(
            reply.body["error"]["message"].as_str(),
            expected.as_deref(),
            "the same answer as an absent session"
        );
    }
    let log = cluster.log("t").await;
    assert_log_sound(&log);
    let texts: Vec<String> = log
        .iter()
        .filter(|event| event.msg.kind() == "submission_queued")
        .map(|event| serde_json::to_string(&event.msg).expect("JSON"))
        .collect();
    assert_eq!(texts.len(), 1, "only globex's own message: {texts:?}");
    assert!(!texts[0].contains("from acme"), "{texts:?}");
}
