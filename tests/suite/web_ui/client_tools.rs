//! A client tool's call in the web UI: the card with a box for the result,
//! "Send result" and "Send as error" posting `client_tool_result`, the
//! result shown once the call completes, also for a page opened later and
//! after a reload; and no box for a key without the `submit` scope.

use std::time::Duration;

use serde_json::{Value, json};

use super::{browser_test, log_of, of_kind, scenario, serve, session_of};
use crate::suite::support::api::Api;
use crate::suite::support::wait::wait_until_async;

/// The client tool the sessions of these tests declare.
fn pick_colour() -> Value {
    json!({
        "name": "pick_colour",
        "description": "Asks the user to pick a colour.",
        "parameters": {
            "type": "object",
            "properties": {"options": {"type": "array", "items": {"type": "string"}}},
            "required": ["options"],
        },
    })
}

/// A script line calling `pick_colour`.
fn pick_call() -> String {
    json!({"tool_calls": [{"name": "pick_colour", "arguments": {"options": ["red", "blue"]}}]}).to_string()
}

/// Creates, through `api`, a session declaring `pick_colour`; its id.
async fn session_with_client_tool(api: &Api) -> String {
    let created = api.create(json!({ "client_tools": [pick_colour()] })).await;
    created["id"].as_str().expect("id").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_answers_a_client_tool_call_with_a_result_or_an_error_and_shows_it_after_a_reload() {
    let Some((tools, _browser, scratch)) =
        browser_test("web_ui_answers_a_client_tool_call_with_a_result_or_an_error_and_shows_it_after_a_reload").await
    else {
        return;
    };
    let call = pick_call();
    let lines = [
        call.as_str(),
        r#"{"text": "You picked blue."}"#,
        call.as_str(),
        r#"{"text": "No colour, then."}"#,
        call.as_str(),
        r#"{"text": "Green it is."}"#,
    ];
    let model = scratch.script("client_tools.jsonl", &lines);
    let server = serve(&scratch, &model, &[]);
    let id = session_with_client_tool(&server.api).await;

    let outcome = scenario(&tools, "client_tools", &server.api.base, json!({ "session_id": id })).await;

    assert_eq!(session_of(&outcome), id);
    // The page sees the last answer's text before its turn's end is stored.
    wait_until_async("the third turn to end", Duration::from_secs(20), async || {
        of_kind(&log_of(&server.api, &id).await, "turn_complete").len() >= 3
    })
    .await;
    let log = log_of(&server.api, &id).await;
    let requested: Vec<&Value> = of_kind(&log, "client_tool_requested");
    assert_eq!(requested.len(), 3, "{log:#?}");
    for request in &requested {
        assert_eq!(request["msg"]["name"], "pick_colour");
    }
    let completed: Vec<(&str, bool)> = of_kind(&log, "tool_call_completed")
        .iter()
        .map(|event| {
            (
                event["msg"]["output"].as_str().expect("output"),
                event["msg"]["is_error"].as_bool().expect("is_error"),
            )
        })
        .collect();
    assert_eq!(
        completed,
        [("blue", false), ("no colour today", true), ("green", false)],
        "what the page sent is what the calls completed with"
    );
    assert_eq!(of_kind(&log, "turn_complete").len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_shows_a_waiting_client_tool_call_without_a_box_to_a_key_without_the_submit_scope() {
    let Some((tools, _browser, scratch)) =
        browser_test("web_ui_shows_a_waiting_client_tool_call_without_a_box_to_a_key_without_the_submit_scope").await
    else {
        return;
    };
    let model = scratch.script("client_tool_scopes.jsonl", &[&pick_call()]);
    let path = scratch.dir.path().join("token");
    std::fs::write(&path, "client-tool-operator\n").expect("write the token file");
    let mut server = serve(&scratch, &model, &["--token-file", &path.display().to_string()]);
    server.api.token = Some("client-tool-operator".to_owned());
    let (_, writer) = super::principals::make_key(&server.api, "acme", "writer", &["read", "submit"]).await;
    let (_, reader) = super::principals::make_key(&server.api, "acme", "reader", &["read"]).await;
    let writer = super::principals::as_key(&server.api, &writer);
    let id = session_with_client_tool(&writer).await;
    writer.say(&id, "Pick a colour").await;
    wait_until_async(
        "the client tool call to be asked",
        Duration::from_secs(20),
        async || !of_kind(&log_of(&writer, &id).await, "client_tool_requested").is_empty(),
    )
    .await;

    let params = json!({ "session_id": id, "credential": reader, "read_only": true });
    let outcome = scenario(&tools, "client_tools", &server.api.base, params).await;

    assert_eq!(outcome.result["shown"]["form"], false, "{}", outcome.output);
    assert_eq!(outcome.result["shown"]["send"], false);
    assert_eq!(outcome.result["shown"]["cannot_answer"], true);
    let log = log_of(&writer, &id).await;
    assert!(of_kind(&log, "tool_call_completed").is_empty(), "the page only looked");
}
