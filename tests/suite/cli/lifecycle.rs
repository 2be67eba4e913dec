//! `keel sessions rm` and `keel backup`: a session's data leaves the
//! database for good; a copy of the database can be taken.

use crate::suite::support::process::{Cli, stderr, stdout};
use crate::suite::support::server::{Scratch, ServeProcess};

#[test]
fn sessions_rm_deletes_the_session_and_optionally_its_workspace() {
    let cli = Cli::new();
    let script = cli.script("s.jsonl", &[r#"{"text": "One."}"#, r#"{"text": "Two."}"#]);
    let model = format!("script:{}", script.display());
    for session in ["gone", "kept"] {
        let output = cli.run(&["run", "--new-session", session, "--model", &model, "hi"]);
        assert!(output.status.success(), "{}", stderr(&output));
    }
    let root = cli.dir.path().join("workspaces");
    let rm_with_workspace = |session: &str| {
        cli.run(&[
            "sessions",
            "rm",
            session,
            "--workspace",
            "--workspace-root",
            root.to_str().expect("utf-8"),
        ])
    };
    // A directory Keel did not create is refused, and the session stays.
    std::fs::create_dir_all(root.join("kept")).expect("operator's directory");
    std::fs::write(root.join("kept/important"), "important").expect("file");
    let refused = rm_with_workspace("kept");
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("Keel has no record of creating it"),
        "{}",
        stderr(&refused)
    );
    assert!(root.join("kept/important").exists());
    // The workspace `keel serve` made for the session goes with it.
    keel::tools::workspace::WorkspaceRoot::open(&root)
        .and_then(|workspaces| workspaces.create(std::ffi::OsStr::new("gone")))
        .expect("the server's workspace");
    std::fs::write(root.join("gone/work.txt"), "work").expect("work");

    let output = rm_with_workspace("gone");
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(!root.join("gone").exists(), "the workspace was removed");

    let listed = cli.run(&["sessions", "--json"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let listed = stdout(&listed);
    assert!(!listed.contains("\"gone\""), "{listed}");
    assert!(listed.contains("\"kept\""), "{listed}");
    let events = cli.run(&["events", "--session", "gone", "--json"]);
    assert!(stdout(&events).trim().is_empty(), "no events left: {}", stdout(&events));
    assert!(!cli.events("kept").is_empty());

    let again = cli.run(&["sessions", "rm", "gone"]);
    assert!(!again.status.success());
    assert!(stderr(&again).contains("no session 'gone'"), "{}", stderr(&again));
}

#[test]
fn sessions_rm_and_fork_refuse_a_served_database_and_name_the_route() {
    let cli = Cli::new();
    let scratch = Scratch::new();
    let server = ServeProcess::start(&scratch, &[]);
    let db = scratch.db().display().to_string();
    let removed = cli.run(&["sessions", "rm", "any", "--db", &db]);
    assert!(!removed.status.success());
    assert!(
        stderr(&removed).contains("DELETE /v1/sessions/any"),
        "{}",
        stderr(&removed)
    );
    let forked = cli.run(&["fork", "any", "--at", "0", "--db", &db]);
    assert!(!forked.status.success());
    assert!(
        stderr(&forked).contains("POST /v1/sessions/any/fork"),
        "{}",
        stderr(&forked)
    );
    drop(server);
}
