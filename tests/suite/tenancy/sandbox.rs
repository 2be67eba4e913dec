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
