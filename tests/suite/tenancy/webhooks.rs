//! Webhook endpoints are a tenant's own: a tenant's admin registers them
//! for its own tenant only, never sees or touches another tenant's, and
//! its endpoints receive only its own sessions' events.

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::keys::serve_with_keys;
use crate::suite::support::api::Api;

async fn make(api: &Api, body: Value) -> (StatusCode, Value) {
    let reply = api.post("/v1/webhooks", &body).await;
    (reply.status, reply.body)
}

async fn session_of(api: &Api, id: &str) {
    let created = api.post("/v1/sessions", &json!({})).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let session = created.body["id"].as_str().expect("an id").to_owned();
    let said = api
        .post(
            &format!("/v1/sessions/{session}/submissions"),
            &json!({"op": {"type": "user_input", "text": id}}),
        )
        .await;
    assert_eq!(said.status, StatusCode::ACCEPTED, "{}", said.body);
    api.wait_idle(&session).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_webhooks_are_its_own_and_receive_only_its_sessions_events() {
    let (served, keys) = serve_with_keys().await;
    let acme = keys.key("acme", &["read", "submit", "admin"]).await;
    let globex = keys.key("globex", &["read", "submit", "admin"]).await;
    let acme_user = keys.key("acme", &["read", "submit", "approve"]).await;
    let hook = |tenant: Option<&str>| {
        let mut body = json!({"url": "https://hooks.example.com/keel", "event_types": ["turn_complete"]});
        if let Some(tenant) = tenant {
            body["tenant"] = json!(tenant);
        }
        body
    };
    // Without `admin`: refused.
    let (status, body) = make(&acme_user, hook(None)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "missing_scope_admin");
    // A tenant's admin gets its own tenant, and may not name another.
    let (status, mine) = make(&acme, hook(None)).await;
    assert_eq!(status, StatusCode::CREATED, "{mine}");
    assert_eq!(mine["tenant"], "acme");
    let (status, body) = make(&acme, hook(Some("globex"))).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "tenant_forbidden");
    let (status, theirs) = make(&globex, hook(Some("globex"))).await;
    assert_eq!(status, StatusCode::CREATED, "{theirs}");
    // The operator's may be for every tenant.
    let (status, everyone) = make(&served.operator, hook(None)).await;
    assert_eq!(status, StatusCode::CREATED, "{everyone}");
    assert_eq!(everyone["tenant"], Value::Null);

    let ids = |listed: &Value| -> Vec<String> {
        listed["webhooks"]
            .as_array()
            .expect("webhooks")
            .iter()
            .map(|endpoint| endpoint["id"].as_str().expect("id").to_owned())
            .collect()
    };
    let mine_id = mine["id"].as_str().expect("id");
    let theirs_id = theirs["id"].as_str().expect("id");
    assert_eq!(ids(&acme.get("/v1/webhooks").await.body), [mine_id]);
    assert_eq!(ids(&globex.get("/v1/webhooks").await.body), [theirs_id]);
    assert_eq!(ids(&served.operator.get("/v1/webhooks").await.body).len(), 3);
    // Another tenant's endpoint is unknown, whatever is asked of it.
    for reply in [
        globex.get(&format!("/v1/webhooks/{mine_id}")).await,
        globex.get(&format!("/v1/webhooks/{mine_id}/deliveries")).await,
        globex.post(&format!("/v1/webhooks/{mine_id}/rotate"), &json!({})).await,
        globex.delete(&format!("/v1/webhooks/{mine_id}")).await,
    ] {
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.body);
    }
    assert_eq!(ids(&acme.get("/v1/webhooks").await.body), [mine_id], "still there");

    // Each tenant's endpoint gets its own sessions' events; the operator's
    // every tenant's.
    session_of(&acme, "from acme").await;
    session_of(&globex, "from globex").await;
    let sessions_of = async |api: &Api, endpoint: &str| -> Vec<String> {
        let reply = api.get(&format!("/v1/webhooks/{endpoint}/deliveries")).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        reply.body["deliveries"]
            .as_array()
            .expect("deliveries")
            .iter()
            .map(|delivery| delivery["session_id"].as_str().expect("session").to_owned())
            .collect()
    };
    let tenant_of = async |session: &str| -> String {
        let shown = served.operator.get(&format!("/v1/sessions/{session}")).await;
        shown.body["tenant"].as_str().expect("tenant").to_owned()
    };
    let acme_sessions = sessions_of(&acme, mine_id).await;
    assert_eq!(acme_sessions.len(), 1, "{acme_sessions:?}");
    assert_eq!(tenant_of(&acme_sessions[0]).await, "acme");
    let globex_sessions = sessions_of(&globex, theirs_id).await;
    assert_eq!(globex_sessions.len(), 1, "{globex_sessions:?}");
    assert_eq!(tenant_of(&globex_sessions[0]).await, "globex");
    let all = sessions_of(&served.operator, everyone["id"].as_str().expect("id")).await;
    assert_eq!(all.len(), 2, "{all:?}");
}
