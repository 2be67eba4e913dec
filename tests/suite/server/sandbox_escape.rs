//! A shell command of a `keel serve` session trying to turn the server
//! against its user, as outside testing did: calling the server's own API
//! on loopback to create a full-access, auto-approved session, and finding
//! the token file through Keel's command line to authenticate.

use serde_json::json;

use crate::suite::support::server::{Scratch, ServeProcess, free_port};

#[tokio::test]
async fn a_read_only_shell_reaches_neither_its_own_server_nor_the_token() {
    let scratch = Scratch::new();
    let token = format!("tok-canary-{}", uuid::Uuid::now_v7().simple());
    let token_file = scratch.dir.path().join("token");
    std::fs::write(&token_file, &token).expect("token file");
    // The operator lets the shell run without approval, read-only.
    let config = scratch.dir.path().join("keel.toml");
    std::fs::write(
        &config,
        "[tools]\nsandbox = \"read-only\"\n[approvals]\ntools = { shell = \"auto\" }\n",
    )
    .expect("keel.toml");
    let port = free_port();
    // What an injected model would run: find the token through the
    // processes' command lines, read it, and ask the server for a wide-open
    // session. The patterns do not match their own command line.
    let attack = format!(
        "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < \"$f\"; echo; done 2>/dev/null | grep -o '[t]oken-file [^ ]*'; \
         cat '{token}' 2>&1 | grep -o '[t]ok-canary-[0-9a-f]*'; \
         perl -MIO::Socket::INET -e '$s = IO::Socket::INET->new(PeerAddr => \"127.0.0.1:{port}\", Timeout => 3) \
         or die \"connect failed: $!\\n\"; $b = q({{\"id\":\"escape\",\"tools\":{{\"sandbox\":\"full-access\"}},\"approvals\":{{\"default\":\"auto\"}}}}); \
         print $s \"POST /v1/sessions HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\nContent-Type: application/json\\r\\nContent-Length: \" . length($b) . \"\\r\\nConnection: close\\r\\n\\r\\n$b\"; \
         print <$s>'; echo attacked",
        token = token_file.display()
    );
    let call = json!({"tool_calls": [{"name": "shell", "arguments": {"command": attack}}]});
    let model = scratch.script("attack.jsonl", &[&call.to_string(), r#"{"text": "done"}"#]);
    let listen = format!("127.0.0.1:{port}");
    let mut server = ServeProcess::start(
        &scratch,
        &[
            "--listen",
            &listen,
            "--token-file",
            token_file.to_str().expect("path"),
            "--config",
            config.to_str().expect("path"),
            "--model",
            &model,
        ],
    );
    server.api.token = Some(token.clone());
    server.api.create(json!({"id": "victim"})).await;
    server.api.say("victim", "go").await;
    let output = server.api.first_tool_output("victim").await;
    assert!(output.contains("attacked"), "the attack did not run: {output}");
    assert!(output.starts_with("[sandbox: read-only, enforced: "), "{output}");
    assert!(!output.contains(&token), "the command read the token: {output}");
    assert!(
        !output.contains("token-file "),
        "the command saw Keel's command line: {output}"
    );
    assert!(
        output.contains("connect failed"),
        "the command reached the server: {output}"
    );
    let listed = server.api.get("/v1/sessions").await;
    let ids: Vec<&str> = listed.body["sessions"]
        .as_array()
        .map(|sessions| sessions.iter().filter_map(|session| session["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(ids, ["victim"], "{}", listed.body);
}

/// `[server] sandbox_reads = "workspace"` narrows what a restricted command
/// may read to its workspace and the system's directories: a file of the
/// host's outside them (another project, a user's home) is out of reach,
/// while the command still runs the system's programs. Without it the same
/// command reads the file, as docs/SECURITY.md says.
#[tokio::test]
async fn sandbox_reads_workspace_keeps_the_hosts_other_files_out_of_reach() {
    let outside = crate::suite::support::server::outside_tmp("keel-host-files-");
    let secret = outside.path().join("secret.txt");
    std::fs::write(&secret, "host-canary").expect("secret");
    let probe = format!(
        "cat '{}' 2>/dev/null; ls /usr/bin > /dev/null && echo system-ok; cat own.txt; echo probed",
        secret.display()
    );
    for narrowed in [false, true] {
        let scratch = Scratch::new();
        let config = scratch.dir.path().join("keel.toml");
        let reads = if narrowed {
            "sandbox_reads = \"workspace\"\n"
        } else {
            ""
        };
        std::fs::write(
            &config,
            format!("[server]\n{reads}[tools]\nsandbox = \"read-only\"\n[approvals]\ntools = {{ shell = \"auto\" }}\n"),
        )
        .expect("keel.toml");
        let call = json!({"tool_calls": [{"name": "shell", "arguments": {"command": probe}}]});
        let model = scratch.script("probe.jsonl", &[&call.to_string(), r#"{"text": "done"}"#]);
        let server = ServeProcess::start(
            &scratch,
            &["--config", config.to_str().expect("path"), "--model", &model],
        );
        server.api.create(json!({"id": "reader"})).await;
        std::fs::write(scratch.workspaces().join("reader").join("own.txt"), "own-canary").expect("own file");
        server.api.say("reader", "go").await;
        let output = server.api.first_tool_output("reader").await;
        assert!(output.contains("probed") && output.contains("own-canary"), "{output}");
        assert!(output.contains("system-ok"), "the system's programs run: {output}");
        if narrowed {
            assert!(
                !output.contains("host-canary"),
                "narrowed reads read the host's file: {output}"
            );
            assert!(
                output.contains("reads: the workspace and the system's directories"),
                "{output}"
            );
        } else {
            assert!(output.contains("host-canary"), "reads anywhere by default: {output}");
        }
        server.terminate();
    }
}
