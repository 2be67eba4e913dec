use super::*;

async fn search(workspace: &Path, arguments: serde_json::Value) -> Result<String, ToolError> {
    super::super::test_call(&Search, workspace, arguments).await
}

fn tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("src/nested")).unwrap();
    std::fs::create_dir_all(root.join("target")).unwrap();
    std::fs::create_dir_all(root.join(".git")).unwrap();
    std::fs::write(root.join(".gitignore"), "target/\n*.log\n").unwrap();
    std::fs::write(root.join("src/main.rs"), "fn main() {\n    // TODO: run\n}\n").unwrap();
    std::fs::write(root.join("src/nested/lib.rs"), "// todo later\npub fn todo() {}\n").unwrap();
    std::fs::write(root.join("notes.md"), "TODO: write docs\r\n").unwrap();
    std::fs::write(root.join("target/out.rs"), "TODO: ignored\n").unwrap();
    std::fs::write(root.join("debug.log"), "TODO: ignored\n").unwrap();
    std::fs::write(root.join(".git/config"), "TODO: never\n").unwrap();
    std::fs::write(root.join("image.bin"), b"TODO\0\x01").unwrap();
    dir
}

#[tokio::test]
async fn matches_come_back_as_path_line_text() {
    let dir = tree();
    let output = search(dir.path(), serde_json::json!({"pattern": "TODO"}))
        .await
        .unwrap();
    assert_eq!(
        output,
        "notes.md:1: TODO: write docs\nsrc/main.rs:2:     // TODO: run\n[skipped 1 binary file]\n"
    );
    let output = search(dir.path(), serde_json::json!({"pattern": "(?i)todo", "path": "src"}))
        .await
        .unwrap();
    assert_eq!(
        output,
        "src/main.rs:2:     // TODO: run\nsrc/nested/lib.rs:1: // todo later\nsrc/nested/lib.rs:2: pub fn todo() {}\n"
    );
}

#[tokio::test]
async fn globs_match_names_or_paths() {
    let dir = tree();
    let by_name = search(dir.path(), serde_json::json!({"pattern": "(?i)todo", "glob": "*.md"}))
        .await
        .unwrap();
    assert_eq!(by_name, "notes.md:1: TODO: write docs\n");
    let by_path = search(
        dir.path(),
        serde_json::json!({"pattern": "(?i)todo", "glob": "src/*.rs"}),
    )
    .await
    .unwrap();
    assert_eq!(by_path, "src/main.rs:2:     // TODO: run\n");
    let deep = search(
        dir.path(),
        serde_json::json!({"pattern": "fn", "glob": "src/**/lib.rs"}),
    )
    .await
    .unwrap();
    assert_eq!(deep, "src/nested/lib.rs:2: pub fn todo() {}\n");
}

#[tokio::test]
async fn a_single_file_can_be_searched() {
    let dir = tree();
    let output = search(dir.path(), serde_json::json!({"pattern": "fn", "path": "src/main.rs"}))
        .await
        .unwrap();
    assert_eq!(output, "src/main.rs:1: fn main() {\n");
}

#[tokio::test]
async fn no_matches_says_what_was_searched() {
    let dir = tree();
    let output = search(
        dir.path(),
        serde_json::json!({"pattern": "nothing here", "path": "src"}),
    )
    .await
    .unwrap();
    assert_eq!(output, "no matches for /nothing here/ in 'src' (2 files searched)\n");
}

#[tokio::test]
async fn ignore_files_of_every_level_apply_with_their_precedence() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join(".git/info")).unwrap();
    std::fs::create_dir_all(root.join("build")).unwrap();
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::write(root.join(".gitignore"), "*.log\n!keep.log\nbuild/\n").unwrap();
    // `.ignore` wins over `.gitignore`, whitelists included.
    std::fs::write(root.join(".ignore"), "secret.txt\n!forced.log\n").unwrap();
    std::fs::write(root.join(".git/info/exclude"), "excluded.txt\n").unwrap();
    std::fs::write(root.join("src/.gitignore"), "gen.rs\n!b.log\n").unwrap();
    for file in [
        "a.log",
        "keep.log",
        "forced.log",
        "build/x.txt",
        "secret.txt",
        "excluded.txt",
        "src/gen.rs",
        "src/b.log",
        "src/c.log",
        "src/main.rs",
    ] {
        std::fs::write(root.join(file), "needle\n").unwrap();
    }
    let output = search(root, serde_json::json!({"pattern": "needle"})).await.unwrap();
    assert_eq!(
        output,
        "forced.log:1: needle\nkeep.log:1: needle\nsrc/b.log:1: needle\nsrc/main.rs:1: needle\n"
    );
    // The rules of the directories above the searched one apply too.
    let output = search(root, serde_json::json!({"pattern": "needle", "path": "src"}))
        .await
        .unwrap();
    assert_eq!(output, "src/b.log:1: needle\nsrc/main.rs:1: needle\n");
}

#[tokio::test]
async fn matches_are_capped_with_a_marker() {
    let dir = tempfile::tempdir().unwrap();
    let text: String = (0..MAX_MATCHES + 50).map(|n| format!("hit {n}\n")).collect();
    std::fs::write(dir.path().join("many.txt"), text).unwrap();
    std::fs::write(dir.path().join("zz.txt"), "hit again\n").unwrap();
    let output = search(dir.path(), serde_json::json!({"pattern": "hit"})).await.unwrap();
    let lines: Vec<&str> = output.lines().collect();
    assert_eq!(lines.len(), MAX_MATCHES + 1);
    assert_eq!(lines[0], "many.txt:1: hit 0");
    assert_eq!(
        lines[MAX_MATCHES - 1],
        format!("many.txt:{MAX_MATCHES}: hit {}", MAX_MATCHES - 1)
    );
    assert_eq!(
        lines[MAX_MATCHES],
        format!("[stopped at {MAX_MATCHES} matches; narrow the search with path, glob or a more specific pattern]")
    );
}

#[tokio::test]
async fn bad_patterns_and_globs_are_argument_errors() {
    let dir = tree();
    let bad = search(dir.path(), serde_json::json!({"pattern": "("}))
        .await
        .unwrap_err();
    assert!(
        matches!(&bad, ToolError::InvalidArguments(message) if message.starts_with("'pattern' is not a valid regex")),
        "{bad:?}"
    );
    let bad = search(dir.path(), serde_json::json!({"pattern": "x", "glob": "a[" }))
        .await
        .unwrap_err();
    assert!(
        matches!(&bad, ToolError::InvalidArguments(message) if message.starts_with("'glob' is not a valid glob")),
        "{bad:?}"
    );
}

#[tokio::test]
async fn long_lines_are_cut() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("wide.txt"), format!("needle {}\n", "x".repeat(500))).unwrap();
    let output = search(dir.path(), serde_json::json!({"pattern": "needle"}))
        .await
        .unwrap();
    assert_eq!(
        output,
        format!("wide.txt:1: needle {}…[line cut: 207 more bytes]\n", "x".repeat(293))
    );
}
