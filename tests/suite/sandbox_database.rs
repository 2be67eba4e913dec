//! No sandboxed command reaches Keel's PostgreSQL database through a Unix
//! socket: a read-only mount does not stop `connect()` on a socket file,
//! and a packaged server's local authentication (`peer`, `trust`) lets in
//! whoever connects. A real server listening on sockets in `/tmp`, in the
//! usual `/run/postgresql` and in the directory Keel connects through;
//! the real `keel run` on it.

use std::path::{Path, PathBuf};

use keel::store::postgres::local::LocalPostgres;

use crate::suite::support::sandbox::{keel_run, outside_scratch, shell_script};

/// `psql` asking the server behind the socket in `dir` for a number the
/// command line does not hold.
fn query_through(dir: &Path, port: u16) -> String {
    format!(
        "psql -h '{}' -p {port} -U postgres -d postgres -Atc 'select 4240 + 2' 2>&1; echo tried",
        dir.display()
    )
}

#[test]
fn no_sandboxed_command_reaches_the_database_through_its_unix_socket() {
    let root = nix::unistd::geteuid().is_root();
    // The directory Keel connects through, outside the temporary directory
    // (which is private to each call anyway).
    let custom = if root {
        tempfile::tempdir_in("/run").expect("socket dir")
    } else {
        outside_scratch()
    };
    let mut directories = vec![custom.path().to_path_buf()];
    let usual = PathBuf::from("/run/postgresql");
    if root && usual.is_dir() {
        directories.push(usual);
    }
    let Some(server) = LocalPostgres::own_with_sockets_in(&directories) else {
        return;
    };
    let url = server.fresh_database();
    let name = url.rsplit('/').next().expect("database name").to_owned();
    let through_socket = format!(
        "postgresql://postgres@{}:{}/{name}",
        custom.path().display().to_string().replace('/', "%2F"),
        server.port()
    );
    let sockets = server.socket_directories();
    assert!(sockets[0].starts_with(std::env::temp_dir()), "{sockets:?}");
    let commands: Vec<String> = sockets.iter().map(|dir| query_through(dir, server.port())).collect();
    let commands: Vec<&str> = commands.iter().map(String::as_str).collect();
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("s.jsonl"), shell_script(&commands)).expect("script");
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_keel"));
    for policy in ["read-only", "workspace-write", "full-access"] {
        let results = keel_run(
            &binary,
            dir.path(),
            Path::new(&through_socket),
            None,
            &["--sandbox", policy],
        );
        assert_eq!(results.len(), sockets.len(), "{policy}: {results:?}");
        for (socket, result) in sockets.iter().zip(&results) {
            assert!(result.contains("tried"), "{policy}, {}: {result}", socket.display());
            if policy == "full-access" {
                // Where nothing is restricted the same command gets in, so
                // the test proves something.
                assert!(
                    result.contains("[stdout]\n4242\n"),
                    "{policy}, {}: {result}",
                    socket.display()
                );
            } else {
                assert!(
                    !result.contains("4242"),
                    "{policy}: reached the database through {}: {result}",
                    socket.display()
                );
                assert!(result.contains("database sockets covered"), "{policy}: {result}");
            }
        }
    }
}
