//! `[auth.jwt]`: tokens of a real identity provider's shape, minted by
//! PyJWT with keys Python made, checked by a real server whose JWKS comes
//! from a file or from a loopback URL.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use keel::config::JwtConfig;
use keel::server::{ServeError, ServerConfig, serve};
use keel::store::{CheckpointStore, SqliteCheckpoint};
use serde_json::{Value, json};

use super::{assert_unauthorized, python, whoami};
use crate::suite::support::http_server::{Reply as HttpReply, ScriptedServer};
use crate::suite::support::server::{Scratch, TestServer};

const ISSUER: &str = "https://idp.example";
const AUDIENCE: &str = "keel";

/// Keys and tokens minted in `dir` (which gets `jwks.json`), by case name.
fn mint(python: &Path, dir: &Path) -> BTreeMap<String, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/suite/auth/mint_tokens.py");
    let output = Command::new(python)
        .arg(script)
        .args([dir.to_str().expect("utf-8 path"), ISSUER, AUDIENCE])
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run the token minter");
    assert!(
        output.status.success(),
        "the minter failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the minter's tokens")
}

/// `[auth.jwt]` of these tests, with the JWKS from a file or a URL.
fn jwt_config(file: Option<&Path>, url: Option<String>) -> JwtConfig {
    let text = format!(
        "issuer = \"{ISSUER}\"\naudience = \"{AUDIENCE}\"\ntenant_claim = \"org\"\nscopes_claim = \"scope\"\n\
         default_scopes = [\"read\"]\nrefresh_secs = 1\n"
    );
    let mut config: JwtConfig = toml::from_str(&text).expect("the [auth.jwt] table");
    config.jwks_file = file.map(Path::to_path_buf);
    config.jwks_url = url;
    config
}

fn principal(reply: &super::Reply) -> Value {
    assert_eq!(reply.status, reqwest::StatusCode::OK, "{}", reply.body);
    reply.body.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwts_from_a_jwks_file_are_principals_and_every_bad_one_is_401() {
    let Some(python) = python("suite::auth::jwt (file)") else {
        return;
    };
    let scratch = Scratch::new();
    let tokens = mint(&python, scratch.dir.path());
    let jwks = scratch.dir.path().join("jwks.json");
    let server = TestServer::start_in(scratch, |config, _| {
        config.token = Some("operator-token".to_owned());
        config.keel.auth.jwt = Some(jwt_config(Some(&jwks), None));
    })
    .await;
    let api = &server.api;

    let alice = principal(&whoami(api, &tokens["rs256"]).await);
    assert_eq!(
        alice,
        json!({"tenant": "acme", "principal_id": "alice@example.com", "kind": "jwt",
               "name": "alice@example.com", "scopes": ["read", "submit"]})
    );
    // ES256, scopes as an array.
    let bob = principal(&whoami(api, &tokens["es256"]).await);
    assert_eq!(bob["tenant"], "globex");
    assert_eq!(bob["principal_id"], "bob");
    assert_eq!(bob["scopes"], json!(["read", "approve"]));
    // EdDSA from a key without `alg`; unknown scope names grant nothing.
    let carol = principal(&whoami(api, &tokens["eddsa"]).await);
    assert_eq!(carol["scopes"], json!(["admin"]));
    // No scope claim: the default scopes.
    let dave = principal(&whoami(api, &tokens["no_scope"]).await);
    assert_eq!(dave["scopes"], json!(["read"]));
    // The operator's token is still the operator.
    let operator = principal(&whoami(api, "operator-token").await);
    assert_eq!(
        operator,
        json!({"tenant": null, "principal_id": "operator", "kind": "operator", "name": null,
               "scopes": ["read", "submit", "approve", "admin"]})
    );
    // A verified token is remembered: the same answer again.
    assert_eq!(principal(&whoami(api, &tokens["rs256"]).await), alice);

    for case in [
        "expired",
        "not_yet_valid",
        "wrong_audience",
        "wrong_issuer",
        "wrong_key",
        "wrong_key_no_kid",
        "no_exp",
        "alg_none",
        "hs256_public_pem",
        "hs256_public_n",
        "tampered",
    ] {
        assert_unauthorized(&whoami(api, &tokens[case]).await, case);
        // Nor on any other route.
        let sessions = super::with(api, &tokens[case]).get("/v1/sessions").await;
        assert_unauthorized(&sessions, case);
    }
    // No credential at all, once JWTs are configured: 401 (there is a token).
    assert_unauthorized(&api.get("/v1/whoami").await, "no credential");
    // A verified token naming no principal: 401, saying why.
    let refused = whoami(api, &tokens["no_tenant"]).await;
    assert_refused_saying(&refused, "the token has no `org` claim naming its tenant");
    server.stop().await;
}

/// A server with the operator's token (`operator-token`) and JWTs checked
/// against the keys minted in its scratch directory, tuned by `configure`;
/// with the minted tokens and a script model's spec.
async fn jwt_server(
    python: &Path,
    configure: impl FnOnce(&mut ServerConfig),
) -> (TestServer, BTreeMap<String, String>, String) {
    let scratch = Scratch::new();
    let tokens = mint(python, scratch.dir.path());
    let jwks = scratch.dir.path().join("jwks.json");
    let model = scratch.script("s.jsonl", &[r#"{"text": "Hi."}"#]);
    let server = TestServer::start_in(scratch, |config, _| {
        config.token = Some("operator-token".to_owned());
        config.keel.auth.jwt = Some(jwt_config(Some(&jwks), None));
        configure(config);
    })
    .await;
    (server, tokens, model)
}

/// `401 unauthorized` whose message says `why`.
fn assert_refused_saying(reply: &super::Reply, why: &str) {
    assert_eq!(reply.status, reqwest::StatusCode::UNAUTHORIZED, "{}", reply.body);
    assert_eq!(reply.code(), "unauthorized", "{}", reply.body);
    let message = reply.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(why), "{message:?} does not say {why:?}");
}

/// A tenant claim is checked with the grammar of every tenant name (so
/// `org:42` is a tenant, and `t%41` is refused saying so), and the
/// operator's tenant `default` is refused to a token unless keel.toml
/// lets credentials name it: such a token would act on the operator's own
/// sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_claim_is_a_tenant_name_and_never_the_operator_s_unless_allowed() {
    let Some(python) = python("suite::auth::jwt (tenants)") else {
        return;
    };
    let (server, tokens, model) = jwt_server(&python, |_| {}).await;
    let api = &server.api;
    let operator = super::with(api, "operator-token");
    let mine = operator
        .post("/v1/sessions", &json!({"id": "operators-own", "model": model}))
        .await;
    assert_eq!(mine.status, reqwest::StatusCode::CREATED, "{}", mine.body);

    assert_eq!(
        principal(&whoami(api, &tokens["tenant_colon"]).await)["tenant"],
        "org:42"
    );
    assert_refused_saying(
        &whoami(api, &tokens["tenant_percent"]).await,
        "the token's `org` claim is not a tenant name: 1 to 128 printable ASCII characters other than `%`",
    );
    let claimed = super::with(api, &tokens["tenant_default"]);
    for path in ["/v1/whoami", "/v1/sessions", "/v1/sessions/operators-own"] {
        assert_refused_saying(&claimed.get(path).await, "[auth] allow_default_tenant = true");
    }
    let deleted = claimed
        .send(claimed.client.delete(claimed.url("/v1/sessions/operators-own")))
        .await;
    assert_refused_saying(&deleted, "allow_default_tenant");
    assert_eq!(
        operator.get("/v1/sessions/operators-own").await.status,
        reqwest::StatusCode::OK
    );
    server.stop().await;

    // The operator may let credentials name it.
    let (server, tokens, _) = jwt_server(&python, |config| config.keel.auth.allow_default_tenant = true).await;
    assert_eq!(
        principal(&whoami(&server.api, &tokens["tenant_default"]).await)["tenant"],
        "default"
    );
    server.stop().await;
}

/// A stream opened with a JWT ends at the token's `exp`: the leeway lets a
/// token through a check made by a clock a little ahead, it does not give
/// the stream more life (30 s by default, which this test would see).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_opened_with_a_jwt_ends_at_its_exp() {
    let Some(python) = python("suite::auth::jwt (exp)") else {
        return;
    };
    let (server, tokens, model) = jwt_server(&python, |_| {}).await;
    let api = &server.api;
    let token = &tokens["short_lived"];
    let payload = token.split('.').nth(1).expect("a payload");
    let claims: Value = serde_json::from_slice(
        &base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, payload).expect("base64url"),
    )
    .expect("claims");
    let exp_ms = claims["exp"].as_u64().expect("exp") * 1000;
    let created = super::with(api, "operator-token")
        .post(
            "/v1/sessions",
            &json!({"id": "brief", "model": model, "tenant": "acme"}),
        )
        .await;
    assert_eq!(created.status, reqwest::StatusCode::CREATED, "{}", created.body);
    let streams = super::keys::open_streams(api, token, "brief").await;
    for stream in streams {
        crate::suite::support::wait::guard("a stream of an expiring JWT", stream)
            .await
            .expect("the watcher");
        let ended_ms = keel::protocol::now_ms();
        assert!(ended_ms + 100 >= exp_ms, "ended {} ms before exp", exp_ms - ended_ms);
        assert!(
            ended_ms < exp_ms + 5_000,
            "ended {} ms after exp (the leeway is not the stream's)",
            ended_ms - exp_ms
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwks_url_is_fetched_refreshed_and_its_last_good_set_kept_when_it_fails() {
    let Some(python) = python("suite::auth::jwt (url)") else {
        return;
    };
    let scratch = Scratch::new();
    let tokens = mint(&python, scratch.dir.path());
    let jwks = std::fs::read_to_string(scratch.dir.path().join("jwks.json")).expect("the JWKS");
    // The first fetch gets the keys; every later one fails (500).
    let idp = ScriptedServer::start(vec![HttpReply::json(200, &jwks)]).await;
    let url = format!("{}/.well-known/jwks.json", idp.url());
    // No token on loopback: with JWTs configured, no credential is 401.
    let server = TestServer::start_in(scratch, |config, _| {
        config.keel.auth.jwt = Some(jwt_config(None, Some(url)));
    })
    .await;
    let api = &server.api;
    assert_eq!(principal(&whoami(api, &tokens["rs256"]).await)["tenant"], "acme");
    assert_unauthorized(&api.get("/v1/sessions").await, "no credential on loopback");
    assert_unauthorized(&whoami(api, &tokens["wrong_key"]).await, "wrong key");

    // Refreshed every second: two failed refreshes later, the keys still work.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(idp.requests().len() >= 3, "the JWKS is fetched again");
    assert_eq!(principal(&whoami(api, &tokens["es256"]).await)["tenant"], "globex");
    assert_eq!(principal(&whoami(api, &tokens["eddsa"]).await)["principal_id"], "carol");
    server.stop().await;
}

/// A JWKS URL that answers with a redirect yields no keys: the fetch goes
/// only where the operator said, never where a redirect points.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwks_url_that_redirects_is_not_followed() {
    let Some(python) = python("suite::auth::jwt (redirect)") else {
        return;
    };
    let scratch = Scratch::new();
    let tokens = mint(&python, scratch.dir.path());
    let jwks = std::fs::read_to_string(scratch.dir.path().join("jwks.json")).expect("the JWKS");
    let elsewhere = ScriptedServer::start(vec![HttpReply::json(200, &jwks)]).await;
    let target = format!("{}/jwks.json", elsewhere.url());
    let idp = ScriptedServer::start(vec![HttpReply::json(302, "{}").header("location", &target)]).await;
    let url = format!("{}/.well-known/jwks.json", idp.url());
    let server = TestServer::start_in(scratch, |config, _| {
        config.keel.auth.jwt = Some(jwt_config(None, Some(url)));
    })
    .await;
    assert_unauthorized(&whoami(&server.api, &tokens["rs256"]).await, "keys behind a redirect");
    assert!(!idp.requests().is_empty(), "the JWKS URL was asked");
    assert!(elsewhere.requests().is_empty(), "the redirect was followed");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_jwt_table_stops_the_server_at_startup() {
    let scratch = Scratch::new();
    let start = |jwt: JwtConfig| {
        let store: std::sync::Arc<dyn CheckpointStore> =
            std::sync::Arc::new(SqliteCheckpoint::new(scratch.db()).expect("store"));
        let mut config = ServerConfig::new(store);
        config.keel.auth.jwt = Some(jwt);
        async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            serve(listener, config, std::future::pending()).await
        }
    };
    let missing = start(jwt_config(Some(&scratch.dir.path().join("none.json")), None)).await;
    assert!(
        matches!(&missing, Err(ServeError::Config(text)) if text.contains("none.json")),
        "{missing:?}"
    );

    let symmetric = scratch.dir.path().join("oct.json");
    std::fs::write(&symmetric, r#"{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}"#).expect("write");
    let refused = start(jwt_config(Some(&symmetric), None)).await;
    assert!(matches!(&refused, Err(ServeError::Config(_))), "{refused:?}");

    let mut unknown_scope = jwt_config(Some(&symmetric), None);
    unknown_scope.default_scopes = vec!["root".to_owned()];
    let refused = start(unknown_scope).await;
    assert!(
        matches!(&refused, Err(ServeError::Config(text)) if text.contains("root")),
        "{refused:?}"
    );

    let both = jwt_config(Some(&symmetric), Some("https://idp.example/jwks".to_owned()));
    let refused = start(both).await;
    assert!(
        matches!(&refused, Err(ServeError::Config(text)) if text.contains("not both")),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_naming_a_new_kid_makes_the_server_read_the_jwks_url_again_soon() {
    let Some(python) = python("suite::auth::jwt (rotation)") else {
        return;
    };
    let scratch = Scratch::new();
    let tokens = mint(&python, scratch.dir.path());
    let full: Value =
        serde_json::from_str(&std::fs::read_to_string(scratch.dir.path().join("jwks.json")).expect("the JWKS"))
            .expect("JSON");
    // The provider publishes its EC key only later (a rotation).
    let mut before = full.clone();
    before["keys"]
        .as_array_mut()
        .expect("keys")
        .retain(|key| key["kid"] != "ec-1");
    let idp = ScriptedServer::start(vec![
        HttpReply::json(200, &before.to_string()),
        HttpReply::json(200, &full.to_string()),
    ])
    .await;
    let mut config = jwt_config(None, Some(format!("{}/jwks", idp.url())));
    // Far from the next periodic read: only the unknown kid explains a read.
    config.refresh_secs = 3600;
    let server = TestServer::start_in(scratch, |server, _| server.keel.auth.jwt = Some(config)).await;
    let api = &server.api;
    assert_eq!(principal(&whoami(api, &tokens["rs256"]).await)["tenant"], "acme");
    assert_unauthorized(&whoami(api, &tokens["es256"]).await, "a kid the set lacks yet");
    super::within(Duration::from_secs(10), "the rotated key accepted", || async {
        whoami(api, &tokens["es256"]).await.status == reqwest::StatusCode::OK
    })
    .await;
    assert_eq!(idp.requests().len(), 2, "one read at startup, one for the new kid");
    server.stop().await;
}
