//! A tenant's shell commands see, under the workspace root, only their own
//! session's workspace: not another tenant's sessions (their names or
//! their files), not the operator's, whatever the restricted policy.
//! Outside testing listed `<root>/~tenants/tA/` and printed tenant A's
//! file from a command of tenant B approved with B's own scope.

use std::path::Path;

use serde_json::{Value, json};

use crate::suite::support::server::TestServer;

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|error| panic!("write {}: {error}", path.display()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_s_shell_sees_no_other_workspace_under_the_root() {
    // A root outside /tmp, which each call gets a private one of anyway (a
    // root there would hide the rest by accident).
    let outside = crate::suite::support::server::outside_tmp("keel-roots-");
    let root = outside.path().join("workspaces");
    let configured = root.clone();
    let server = TestServer::start(move |config, _| {
        config.workspace_root = configured;
        config.keel.server.auto_approve = vec!["shell".to_owned()];
    })
    .await;
    let api = &server.api;
    let quiet = server.scratch.script("quiet.jsonl", &[r#"{"text": "ok"}"#]);
    api.create(json!({"id": "op-own", "model": quiet})).await;
    api.create(json!({"id": "a-secret", "tenant": "tA", "model": quiet}))
        .await;
    let tenants = root.join("~tenants");
    write(&root.join("op-own").join("op.txt"), "operator-canary");
    write(
        &tenants.join("tA").join("a-secret").join("secret.txt"),
        "tenant-a-canary",
    );

    let root_text = root.display().to_string();
    // What it finds and lists is marked, so that the paths the command
    // names itself (in an error message) are not taken for what it saw.
    let probe = format!(
        "find '{root}' 2>/dev/null | head -50 | sed 's/^/found: /'; \
         ls -a '{root}/~tenants/tA' 2>/dev/null | sed 's/^/listed: /'; \
         cat '{root}/~tenants/tA/a-secret/secret.txt' '{root}/op-own/op.txt' 2>/dev/null; \
         cat own.txt; echo probed",
        root = root_text
    );
    for (session, policy) in [("b-ro", "read-only"), ("b-ww", "workspace-write")] {
        let call = json!({"tool_calls": [{"name": "shell", "arguments": {"command": probe}}]});
        let model = server
            .scratch
            .script(&format!("{session}.jsonl"), &[&call.to_string(), r#"{"text": "done"}"#]);
        let created: Value = api
            .create(json!({"id": session, "tenant": "tB", "model": model,
                "tools": {"sandbox": policy}, "approvals": {"tools": {"shell": "auto"}}}))
            .await;
        assert_eq!(created["tenant"], "tB", "{created}");
        write(&tenants.join("tB").join(session).join("own.txt"), "own-canary");
        api.say(session, "look around").await;
        let output = api.first_tool_output(session).await;
        assert!(
            output.starts_with(&format!("[sandbox: {policy}, enforced: ")),
            "{output}"
        );
        assert!(output.contains("probed"), "the probe did not run: {output}");
        assert!(output.contains("own-canary"), "its own workspace is hidden: {output}");
        for canary in ["tenant-a-canary", "operator-canary"] {
            assert!(
                !output.contains(canary),
                "{policy}: the command read {canary}: {output}"
            );
        }
        assert!(
            !output.contains("listed: "),
            "{policy}: tenant A's sessions listed: {output}"
        );
        let found: Vec<&str> = output.lines().filter_map(|line| line.strip_prefix("found: ")).collect();
        let own = format!("{root_text}/~tenants/tB/{session}/own.txt");
        assert!(found.contains(&own.as_str()), "{policy}: {found:?}");
        let other_probe = if session == "b-ro" { "b-ww" } else { "b-ro" };
        for seen in &found {
            let visible = [
                root_text.clone(),
                format!("{root_text}/~tenants"),
                format!("{root_text}/~tenants/tB"),
            ];
            assert!(
                visible.iter().any(|allowed| seen == allowed)
                    || seen.starts_with(&format!("{root_text}/~tenants/tB/{session}")),
                "{policy}: the command saw {seen} (its tenant's other session is {other_probe}): {found:?}"
            );
        }
        api.wait_idle(session).await;
    }
    server.stop().await;
}

/// An MCP server Keel starts for a session sees, under the workspace root,
/// only that session's workspace, and none of Keel's protected files: the
/// real filesystem server, which the operator allowed into the whole root,
/// cannot list tenant A's sessions or read A's file for tenant B's model.
/// Before, it ran with the host as it is and did both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_server_of_one_tenant_sees_no_other_workspace_under_the_root() {
    if crate::suite::mcp::mcp_skipped(
        "an_mcp_server_of_one_tenant_sees_no_other_workspace_under_the_root",
        true,
    ) {
        return;
    }
    let outside = crate::suite::support::server::outside_tmp("keel-roots-");
    let root = outside.path().join("workspaces");
    std::fs::create_dir_all(&root).expect("the root");
    let configured = root.clone();
    let tools = ["files__list_directory", "files__read_text_file"].map(str::to_owned);
    let approved = tools.clone();
    let server = TestServer::start(move |config, _| {
        config.workspace_root = configured.clone();
        config.keel.server.auto_approve = approved.to_vec();
        config
            .keel
            .mcp
            .servers
            .insert("files".into(), crate::suite::mcp::filesystem(&configured));
    })
    .await;
    let api = &server.api;
    let quiet = server.scratch.script("quiet.jsonl", &[r#"{"text": "ok"}"#]);
    api.create(json!({"id": "a-secret", "tenant": "tA", "model": quiet}))
        .await;
    let tenants = root.join("~tenants");
    write(
        &tenants.join("tA").join("a-secret").join("secret.txt"),
        "tenant-a-canary",
    );

    let call = |name: &str, path: &Path| {
        json!({"tool_calls": [{"name": name, "arguments": {"path": path.display().to_string()}}]}).to_string()
    };
    let own = tenants.join("tB").join("b-mcp").join("own.txt");
    let steps = [
        call("files__read_text_file", &own),
        call("files__list_directory", &tenants),
        call(
            "files__read_text_file",
            &tenants.join("tA").join("a-secret").join("secret.txt"),
        ),
        r#"{"text": "done"}"#.to_owned(),
    ];
    let steps: Vec<&str> = steps.iter().map(String::as_str).collect();
    let model = server.scratch.script("b-mcp.jsonl", &steps);
    let auto: serde_json::Map<String, Value> = tools.iter().map(|tool| (tool.clone(), json!("auto"))).collect();
    api.create(json!({"id": "b-mcp", "tenant": "tB", "model": model, "approvals": {"tools": auto}}))
        .await;
    write(&own, "own-canary");
    api.say("b-mcp", "look around").await;
    api.wait_idle("b-mcp").await;
    let events = api.get("/v1/sessions/b-mcp/events?limit=1000").await;
    let outputs: Vec<String> = events.body["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|event| event["msg"]["type"] == "tool_call_completed")
        .map(|event| event["msg"]["output"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(outputs.len(), 3, "{outputs:?}");
    assert!(outputs[0].contains("own-canary"), "its own file is hidden: {outputs:?}");
    assert!(
        outputs[1].contains("tB"),
        "its tenant's directory is hidden: {outputs:?}"
    );
    assert!(!outputs[1].contains("tA"), "tenant A's directory listed: {outputs:?}");
    assert!(
        !outputs[2].contains("tenant-a-canary") && outputs[2].contains("ENOENT"),
        "the MCP server read tenant A's file: {outputs:?}"
    );
    server.stop().await;
}
