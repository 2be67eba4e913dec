//! The file tools against a process that swaps a directory of the workspace
//! for a symbolic link leading out of it, as fast as it can: no call may
//! read, list, search or change anything outside, whoever wins the race.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use keel::tools::workspace::{WorkspaceToolsConfig, tools};
use keel::tools::{Tool, ToolContext};
use rustix::fs::RenameFlags;

use crate::suite::support::wait::guard;

/// Rounds of calls (one of each tool per round), and a time bound so the
/// test stays short on a slow machine.
const ROUNDS: usize = 1500;
const TIME_LIMIT: Duration = Duration::from_secs(3);

/// What only the outside files contain; seeing it in a result is a leak.
const OUTSIDE_MARK: &str = "OUTSIDE";

/// A workspace holding `real/` (a directory) and `swap` (a symbolic link to
/// the directory `outside/` beside the workspace). Both hold files of the
/// same names, so a call that is redirected finds what it expects.
struct Arena {
    _dir: tempfile::TempDir,
    workspace: PathBuf,
    outside: PathBuf,
}

impl Arena {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("ws");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(workspace.join("real")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(workspace.join("real/r.txt"), "inside\n").unwrap();
        std::fs::write(workspace.join("real/e.txt"), "shared word\n").unwrap();
        for (name, content) in Self::outside_files() {
            std::fs::write(outside.join(name), content).unwrap();
        }
        std::os::unix::fs::symlink(&outside, workspace.join("swap")).unwrap();
        Self {
            _dir: dir,
            workspace,
            outside,
        }
    }

    fn outside_files() -> [(&'static str, &'static str); 3] {
        [
            ("r.txt", "OUTSIDE secret\n"),
            ("e.txt", "OUTSIDE shared word\n"),
            ("OUTSIDE-only.txt", "OUTSIDE\n"),
        ]
    }

    /// Counts (and undoes) whatever calls changed outside since the last
    /// look: files created, the edited file changed.
    fn undo_outside_changes(&self) -> u64 {
        let mut changes = 0;
        let expected: Vec<&str> = Self::outside_files().iter().map(|(name, _)| *name).collect();
        for entry in std::fs::read_dir(&self.outside).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            if !expected.contains(&name.as_str()) {
                changes += 1;
                let path = entry.path();
                if path.is_dir() {
                    std::fs::remove_dir_all(&path).unwrap();
                } else {
                    std::fs::remove_file(&path).unwrap();
                }
            }
        }
        for (name, content) in Self::outside_files() {
            let path = self.outside.join(name);
            if std::fs::read_to_string(&path).ok().as_deref() != Some(content) {
                changes += 1;
                std::fs::write(&path, content).unwrap();
            }
        }
        changes
    }
}

/// Swaps `real` and `swap` with `renameat2(RENAME_EXCHANGE)` until told to
/// stop, counting in `swaps`, then leaves `real` a directory again.
fn swapper(workspace: &Path, stop: Arc<AtomicBool>, swaps: Arc<AtomicU64>) -> std::thread::JoinHandle<()> {
    let dir = std::fs::File::open(workspace).unwrap();
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            rustix::fs::renameat_with(&dir, "real", &dir, "swap", RenameFlags::EXCHANGE).unwrap();
            swaps.fetch_add(1, Ordering::Relaxed);
        }
        if swaps.load(Ordering::Relaxed) % 2 == 1 {
            rustix::fs::renameat_with(&dir, "real", &dir, "swap", RenameFlags::EXCHANGE).unwrap();
        }
    })
}

async fn call(tool: &dyn Tool, context: &ToolContext, arguments: serde_json::Value) -> Result<String, String> {
    let serde_json::Value::Object(arguments) = arguments else {
        panic!("arguments must be an object")
    };
    guard(&tool.spec().name, tool.call(arguments, context))
        .await
        .map_err(|error| format!("{error:?}"))
}

#[tokio::test]
async fn file_tools_stay_inside_while_a_directory_is_swapped_for_an_outside_link() {
    let arena = Arena::new();
    let context = ToolContext {
        session_id: "s".into(),
        workspace: arena.workspace.clone(),
    };
    let set = tools(WorkspaceToolsConfig {
        write: true,
        shell: None,
    });
    let tool = |name: &str| -> Arc<dyn Tool> {
        set.iter()
            .find(|tool| tool.spec().name == name)
            .cloned()
            .unwrap_or_else(|| panic!("no tool {name}"))
    };
    let (read, list, search, write, edit) = (
        tool("read_file"),
        tool("list_dir"),
        tool("search"),
        tool("write_file"),
        tool("edit_file"),
    );

    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let swapping = swapper(&arena.workspace, stop.clone(), swaps.clone());

    let mut leaks: Vec<String> = Vec::new();
    let mut writes_outside = 0;
    let mut edits_outside = 0;
    let (mut succeeded, mut calls) = (0, 0);
    let started = Instant::now();
    let mut rounds = 0;
    while rounds < ROUNDS && started.elapsed() < TIME_LIMIT {
        rounds += 1;
        let reads = [
            (
                "read_file",
                call(&*read, &context, serde_json::json!({"path": "real/r.txt"})).await,
            ),
            (
                "list_dir",
                call(&*list, &context, serde_json::json!({"path": "real"})).await,
            ),
            (
                "search",
                call(
                    &*search,
                    &context,
                    serde_json::json!({"pattern": "secret|word", "path": "real"}),
                )
                .await,
            ),
        ];
        for (name, result) in reads {
            calls += 1;
            if let Ok(output) = result {
                succeeded += 1;
                if output.contains(OUTSIDE_MARK) {
                    leaks.push(format!("{name}: {output}"));
                }
            }
        }
        let changes = [
            call(
                &*write,
                &context,
                serde_json::json!({"path": "real/w.txt", "content": "written"}),
            )
            .await,
            call(
                &*write,
                &context,
                serde_json::json!({"path": "real/sub/new.txt", "content": "written"}),
            )
            .await,
        ];
        calls += 2;
        succeeded += changes.iter().filter(|result| result.is_ok()).count();
        writes_outside += arena.undo_outside_changes();
        let (old, new) = if rounds % 2 == 0 {
            ("shared word", "shared WORD")
        } else {
            ("shared WORD", "shared word")
        };
        let edited = call(
            &*edit,
            &context,
            serde_json::json!({"path": "real/e.txt", "old_string": old, "new_string": new}),
        )
        .await;
        calls += 1;
        succeeded += usize::from(edited.is_ok());
        edits_outside += arena.undo_outside_changes();
    }
    stop.store(true, Ordering::Relaxed);
    swapping.join().unwrap();
    let swaps = swaps.load(Ordering::Relaxed);

    eprintln!(
        "{rounds} rounds, {calls} calls ({succeeded} succeeded), {swaps} swaps, {} leaks, {writes_outside} writes \
         and {edits_outside} edits outside",
        leaks.len()
    );
    assert!(swaps > 100, "the swapper hardly ran ({swaps} swaps)");
    assert!(
        leaks.is_empty() && writes_outside == 0 && edits_outside == 0,
        "{rounds} rounds, {calls} calls ({succeeded} succeeded), {swaps} swaps: {} reads showed outside content, \
         {writes_outside} writes and {edits_outside} edits changed the outside directory; first leak: {:?}",
        leaks.len(),
        leaks.first()
    );
    // The race did not stop the tools from working when `real` was there.
    assert!(succeeded > 0, "no call succeeded in {calls} calls");
    assert_eq!(arena.undo_outside_changes(), 0);
}

/// A session's workspace that Keel created (as `keel serve` does) swapped,
/// as fast as another process can, with a link to a directory outside: the
/// file tools open the workspace by handle and check it is the directory
/// Keel recorded, so no call reads, lists, searches or writes outside.
#[tokio::test]
async fn file_tools_never_follow_a_workspace_swapped_for_an_outside_link() {
    let arena = Arena::new();
    let root_dir = arena.workspace.join("root");
    let workspaces = keel::tools::workspace::WorkspaceRoot::open(&root_dir).unwrap();
    let workspace = workspaces.create(std::ffi::OsStr::new("real")).unwrap();
    std::fs::write(workspace.join("r.txt"), "inside\n").unwrap();
    std::os::unix::fs::symlink(&arena.outside, root_dir.join("swap")).unwrap();
    let context = ToolContext {
        session_id: "s".into(),
        workspace,
    };
    let set = tools(WorkspaceToolsConfig {
        write: true,
        shell: None,
    });
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let swapping = swapper(&root_dir, stop.clone(), swaps.clone());
    let arguments = |name: &str| match name {
        "read_file" => serde_json::json!({"path": "r.txt"}),
        "list_dir" => serde_json::json!({}),
        "search" => serde_json::json!({"pattern": "OUTSIDE|inside"}),
        "write_file" => serde_json::json!({"path": "w.txt", "content": "written"}),
        _ => serde_json::json!({"path": "e.txt", "old_string": "shared", "new_string": "changed"}),
    };
    let (mut leaks, mut changes, mut refused, mut calls) = (Vec::new(), 0, 0, 0);
    let started = Instant::now();
    while calls < ROUNDS * 5 && started.elapsed() < TIME_LIMIT {
        for tool in &set {
            let name = tool.spec().name;
            calls += 1;
            match call(&**tool, &context, arguments(&name)).await {
                Ok(output) if output.contains(OUTSIDE_MARK) => leaks.push(format!("{name}: {output}")),
                Ok(_) => {}
                Err(error) if error.contains("is not the directory Keel created") => refused += 1,
                Err(_) => {}
            }
            changes += arena.undo_outside_changes();
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapping.join().unwrap();
    let swaps = swaps.load(Ordering::Relaxed);
    eprintln!("{calls} calls, {refused} refused, {swaps} swaps");
    assert!(swaps > 100, "the swapper hardly ran ({swaps} swaps)");
    assert!(
        leaks.is_empty() && changes == 0,
        "{calls} calls, {swaps} swaps: {} leaks, {changes} changes outside; first leak: {:?}",
        leaks.len(),
        leaks.first()
    );
    assert!(refused > 0, "no call met the swapped workspace in {calls} calls");
}
