use std::os::unix::fs::symlink;

use super::*;

struct Fixture {
    _dir: tempfile::TempDir,
    outside: PathBuf,
    workspace: Workspace,
}

/// A workspace with `a/b.txt`, and a directory `outside` beside it
/// holding `secret.txt`.
fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(root.join("a")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(root.join("a/b.txt"), "b").unwrap();
    std::fs::write(outside.join("secret.txt"), "secret").unwrap();
    let workspace = Workspace::new(&root).unwrap();
    let outside = std::fs::canonicalize(outside).unwrap();
    Fixture {
        _dir: dir,
        outside,
        workspace,
    }
}

fn refused(workspace: &Workspace, path: &str) -> String {
    match workspace.resolve(path) {
        Err(ToolError::Failed(message)) => message,
        other => panic!("{path}: expected a refusal, got {other:?}"),
    }
}

#[test]
fn relative_and_absolute_paths_inside_resolve() {
    let fixture = fixture();
    let root = fixture.workspace.root().to_path_buf();
    for path in ["a/b.txt", "./a/b.txt", "a/./b.txt", "a/../a/b.txt"] {
        assert_eq!(
            fixture.workspace.resolve(path).unwrap(),
            Resolved {
                path: root.join("a/b.txt"),
                exists: true
            },
            "{path}"
        );
    }
    let absolute = root.join("a/b.txt");
    assert_eq!(
        fixture.workspace.resolve(absolute.to_str().unwrap()).unwrap().path,
        absolute
    );
    for path in ["", ".", "a/.."] {
        assert_eq!(fixture.workspace.resolve(path).unwrap().path, root, "{path}");
    }
    let missing = fixture.workspace.resolve("new/dir/file.txt").unwrap();
    assert_eq!(
        missing,
        Resolved {
            path: root.join("new/dir/file.txt"),
            exists: false
        }
    );
    assert_eq!(fixture.workspace.display(&missing.path), "new/dir/file.txt");
    assert_eq!(fixture.workspace.display(&root), ".");
}

#[test]
fn climbing_out_and_absolute_paths_elsewhere_are_refused() {
    let fixture = fixture();
    for path in ["../x", "a/../../b", "..", "a/b.txt/../../../outside/secret.txt"] {
        let message = refused(&fixture.workspace, path);
        assert!(
            message.contains(&format!("'{path}' is outside the workspace")),
            "{message}"
        );
        assert!(message.contains("climbs above the workspace root"), "{message}");
    }
    let message = refused(&fixture.workspace, "/etc/passwd");
    assert!(
        message.starts_with("'/etc/passwd' is outside the workspace "),
        "{message}"
    );
    let root = fixture.workspace.root().display().to_string();
    let sneaky = format!("{root}/../outside/secret.txt");
    assert!(refused(&fixture.workspace, &sneaky).contains("climbs above"));
}

#[test]
fn symbolic_links_leading_outside_are_refused() {
    let fixture = fixture();
    let root = fixture.workspace.root().to_path_buf();
    symlink(fixture.outside.join("secret.txt"), root.join("file-link")).unwrap();
    symlink(&fixture.outside, root.join("dir-link")).unwrap();
    symlink("../outside", root.join("relative-link")).unwrap();
    symlink(fixture.outside.join("missing.txt"), root.join("dangling")).unwrap();
    for (path, target) in [
        ("file-link", fixture.outside.join("secret.txt")),
        ("dir-link/secret.txt", fixture.outside.join("secret.txt")),
        ("dir-link", fixture.outside.clone()),
        ("relative-link/secret.txt", fixture.outside.join("secret.txt")),
        // Not-yet-existing files below a link, and through a dangling link.
        ("dir-link/new/file.txt", fixture.outside.join("new/file.txt")),
        ("dangling", fixture.outside.join("missing.txt")),
    ] {
        let message = refused(&fixture.workspace, path);
        assert_eq!(
            message,
            format!(
                "'{path}' leads outside the workspace through a symbolic link: it resolves to {}, which is not under the workspace {}",
                target.display(),
                root.display()
            )
        );
    }
}

#[test]
fn symbolic_links_inside_the_workspace_are_followed() {
    let fixture = fixture();
    let root = fixture.workspace.root().to_path_buf();
    symlink("a", root.join("inner")).unwrap();
    symlink(root.join("a/b.txt"), root.join("b-link")).unwrap();
    // A link that leaves and comes back ends inside: allowed.
    symlink(
        format!("../{}/a", root.file_name().unwrap().to_str().unwrap()),
        root.join("round-trip"),
    )
    .unwrap();
    for path in ["inner/b.txt", "b-link", "round-trip/b.txt"] {
        assert_eq!(
            fixture.workspace.resolve(path).unwrap().path,
            root.join("a/b.txt"),
            "{path}"
        );
    }
    assert_eq!(
        fixture.workspace.resolve("inner/new.txt").unwrap(),
        Resolved {
            path: root.join("a/new.txt"),
            exists: false
        }
    );
}

#[test]
fn links_passing_through_outside_are_refused_even_if_they_come_back() {
    let fixture = fixture();
    let root = fixture.workspace.root().to_path_buf();
    symlink(root.join("a"), fixture.outside.join("back")).unwrap();
    symlink(fixture.outside.join("back"), root.join("via")).unwrap();
    symlink("..", root.join("up")).unwrap();
    assert_eq!(
        refused(&fixture.workspace, "via/b.txt"),
        format!(
            "'via/b.txt' leads outside the workspace through a symbolic link: it passes through {}, which is \
             not under the workspace {}",
            fixture.outside.display(),
            root.display()
        )
    );
    assert_eq!(
        refused(&fixture.workspace, "up"),
        format!(
            "'up' leads outside the workspace through a symbolic link: it resolves to {}, which is not under \
             the workspace {}",
            root.parent().unwrap().display(),
            root.display()
        )
    );
}

#[test]
fn a_location_acts_through_the_handles_it_found_even_after_a_swap() {
    let fixture = fixture();
    let root = fixture.workspace.root().to_path_buf();
    let existing = fixture.workspace.locate("a/b.txt").unwrap();
    let missing = fixture.workspace.locate("a/new/c.txt").unwrap();
    let listed = fixture.workspace.locate("a").unwrap();
    // `a` is swapped for a link leading out after the lookup.
    std::fs::rename(root.join("a"), root.join("moved")).unwrap();
    symlink(&fixture.outside, root.join("a")).unwrap();

    let mut text = String::new();
    std::io::Read::read_to_string(&mut existing.open_file().unwrap(), &mut text).unwrap();
    assert_eq!(text, "b");
    let (dir, name) = missing.parent_for_write().unwrap();
    dir.write(name, "c").unwrap();
    assert_eq!(std::fs::read_to_string(root.join("moved/new/c.txt")).unwrap(), "c");
    assert!(!fixture.outside.join("new").exists(), "nothing was created outside");
    // `a` itself is the last component of that lookup: it is opened
    // without following the link now there, so it fails, not lists
    // outside.
    let error = listed.open_dir().unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::NotADirectory, "{error}");
    // A new lookup sees the link, and refuses it.
    assert!(refused(&fixture.workspace, "a/b.txt").contains("leads outside the workspace"));
}

#[test]
fn link_loops_are_reported() {
    let fixture = fixture();
    let root = fixture.workspace.root().to_path_buf();
    symlink("loop-b", root.join("loop-a")).unwrap();
    symlink("loop-a", root.join("loop-b")).unwrap();
    let message = refused(&fixture.workspace, "loop-a");
    assert!(message.contains("too many levels of symbolic links"), "{message}");
}

#[test]
fn the_workspace_itself_is_canonicalized() {
    let fixture = fixture();
    let root = fixture.workspace.root().to_path_buf();
    let alias = root.parent().unwrap().join("alias");
    symlink(&root, &alias).unwrap();
    let workspace = Workspace::new(&alias).unwrap();
    assert_eq!(workspace.root(), root);
    // An absolute path written with the alias is inside too.
    let through_alias = alias.join("a/b.txt");
    assert_eq!(
        workspace.resolve(through_alias.to_str().unwrap()).unwrap().path,
        root.join("a/b.txt")
    );
    let missing = root.parent().unwrap().join("no-such-workspace");
    assert!(Workspace::new(&missing).is_err());
}
