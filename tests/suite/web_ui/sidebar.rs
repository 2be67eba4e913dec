//! The sidebar and the code blocks of the web UI: "New chat" with the
//! server's models, sessions by last activity grouped by day, switching the
//! model of a session the server no longer offers (at 1280 and 390 px),
//! and syntax highlighting that cannot inject markup.

use std::path::Path;

use serde_json::{Value, json};

use super::{browser_test, log_of, of_kind, scenario, serve};
use crate::suite::support::server::{Scratch, ServeProcess};

const DAY_MS: u64 = 24 * 60 * 60 * 1000;

/// Sets the last activity of `session_id` in the database file (the server
/// is stopped), so that a list can span days.
fn set_activity(db: &Path, session_id: &str, updated_at_ms: u64) {
    let conn = rusqlite::Connection::open(db).expect("open the database");
    let changed = conn
        .execute(
            "UPDATE sessions SET updated_at_ms = ?2 WHERE id = ?1",
            rusqlite::params![session_id, i64::try_from(updated_at_ms).expect("a time")],
        )
        .expect("update");
    assert_eq!(changed, 1, "{session_id}");
}

/// Sessions made under the quickstart's script model, some moved back in
/// time; then the server restarted with a keel.toml model and a script
/// directory that does not hold the quickstart's script. Answers the
/// server and the list the sidebar should show.
async fn stale_sessions(scratch: &Scratch, stale: &str) -> (ServeProcess, Vec<String>) {
    let root = scratch.dir.path();
    std::fs::create_dir_all(root.join("examples")).expect("mkdir");
    std::fs::write(root.join("examples/hello.jsonl"), r#"{"text": "old model"}"#).expect("write");
    let server = serve(scratch, "script:examples/hello.jsonl", &[]);
    for id in ["week-old", "month-old", "day-old", stale] {
        server.api.create(json!({"id": id})).await;
    }
    let _ = server.terminate();
    let now = keel::protocol::now_ms();
    set_activity(&scratch.db(), "day-old", now - DAY_MS);
    set_activity(&scratch.db(), "week-old", now - 4 * DAY_MS);
    set_activity(&scratch.db(), "month-old", now - 30 * DAY_MS);

    std::fs::create_dir_all(root.join("scripts")).expect("mkdir");
    let fast = root.join("fast.jsonl");
    std::fs::write(&fast, r#"{"text": "Answered by fast."}"#).expect("write");
    let config = root.join("keel.toml");
    std::fs::write(
        &config,
        format!(
            "model = \"fast\"\n[models.fast]\nprovider = \"script\"\nmodel = \"{}\"\n[models.other]\nprovider = \
             \"script\"\nmodel = \"{}\"\n",
            fast.display(),
            fast.display()
        ),
    )
    .expect("write keel.toml");
    let scripts = root.join("scripts").display().to_string();
    let config = config.display().to_string();
    let server = ServeProcess::start(scratch, &["--config", &config, "--script-dir", &scripts]);
    let grouped = [
        "# Today",
        stale,
        "# Yesterday",
        "day-old",
        "# Previous 7 days",
        "week-old",
        "# Older",
        "month-old",
    ]
    .map(str::to_owned)
    .to_vec();
    (server, grouped)
}

async fn sidebar_at(test: &str, width: u32) {
    let Some((tools, _browser, scratch)) = browser_test(test).await else {
        return;
    };
    let (server, grouped) = stale_sessions(&scratch, "stale").await;
    let params = json!({
        "width": width,
        "grouped": grouped,
        "stale": "stale",
        "default_model": "fast",
        "models": ["fast", "other"],
        "answer": "Answered by fast.",
    });
    scenario(&tools, "sidebar", &server.api.base, params).await;
    let shown = server.api.session("stale").await;
    assert_eq!(shown["model"], "fast", "{shown}");
    let log = log_of(&server.api, "stale").await;
    let changed: Vec<&Value> = of_kind(&log, "model_changed");
    assert_eq!(changed.len(), 1, "{log:?}");
    assert_eq!(changed[0]["msg"]["model"], "fast");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_sidebar_groups_by_day_starts_new_chats_and_switches_a_stale_model() {
    sidebar_at(
        "web_ui_sidebar_groups_by_day_starts_new_chats_and_switches_a_stale_model",
        1280,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_sidebar_on_a_phone() {
    sidebar_at("web_ui_sidebar_on_a_phone", 390).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_highlights_code_blocks_without_letting_them_inject_markup() {
    let test = "web_ui_highlights_code_blocks_without_letting_them_inject_markup";
    let Some((tools, _browser, scratch)) = browser_test(test).await else {
        return;
    };
    let answer = "```rust\nfn main() {\n    let greeting = \"</code></pre><img src=x onerror=\\\"window.__pwned = 1\\\">\";\n}\n```\n\n\
                  ```html\n<script>window.__pwned = 2</script><b onclick=\"window.__pwned = 3\">x</b>\n```\n\n\
                  ```\nplain <i>text</i>\n```";
    let model = scratch.script("highlight.jsonl", &[&json!({ "text": answer }).to_string()]);
    let server = serve(&scratch, &model, &[]);
    let outcome = scenario(&tools, "highlight", &server.api.base, json!({})).await;
    assert!(outcome.result.is_object(), "{}", outcome.output);
}
