//! A real `keel serve` with the operator's token, and API keys made for a
//! tenant through it (`POST /v1/keys`), for the tests of this module.

use reqwest::StatusCode;
use serde_json::json;

use crate::suite::support::api::Api;
use crate::suite::support::server::{Scratch, ServeProcess};

/// The server's token: the operator.
pub(super) const OPERATOR_TOKEN: &str = "operator-token-of-the-tenancy-tests";

const ANSWER: &str = r#"{"text": "hi", "usage": {"input_tokens": 5, "output_tokens": 2}}"#;

/// `keel serve` as a process over a scratch directory.
pub(super) struct Served {
    /// Kept for as long as the server runs.
    _scratch: Scratch,
    _process: ServeProcess,
    /// Without credentials (for the description).
    pub(super) api: Api,
    /// With the operator's token.
    pub(super) operator: Api,
}

/// Makes keys through the operator.
pub(super) struct Keys {
    operator: Api,
}

impl Keys {
    /// A client holding a new key of `tenant` with `scopes`.
    pub(super) async fn key(&self, tenant: &str, scopes: &[&str]) -> Api {
        let name = format!("{tenant} {}", scopes.join(","));
        let reply = self
            .operator
            .post("/v1/keys", &json!({"tenant": tenant, "name": name, "scopes": scopes}))
            .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
        let key = reply.body["key"].as_str().expect("the key").to_owned();
        Api {
            token: Some(key),
            ..self.operator.clone()
        }
    }
}

/// A server whose default model answers (with usage) as often as asked.
pub(super) async fn serve_with_keys() -> (Served, Keys) {
    let scratch = Scratch::new();
    let token = scratch.dir.path().join("token");
    std::fs::write(&token, OPERATOR_TOKEN).expect("write the token");
    let script = scratch.script("answer.jsonl", &[ANSWER; 64]);
    let process = ServeProcess::start(
        &scratch,
        &["--token-file", token.to_str().expect("utf-8"), "--model", &script],
    );
    let api = process.api.clone();
    let operator = Api {
        token: Some(OPERATOR_TOKEN.to_owned()),
        ..api.clone()
    };
    let keys = Keys {
        operator: operator.clone(),
    };
    (
        Served {
            _scratch: scratch,
            _process: process,
            api,
            operator,
        },
        keys,
    )
}
