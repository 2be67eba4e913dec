//! A PostgreSQL password given to a command never shows in what it prints:
//! not in errors, whatever form the connection string takes, and the
//! command warns that a password on its command line is visible to every
//! local user.

use crate::suite::support::process::{Cli, stderr, stdout};

/// The finding: `keel backup --db 'postgres://…?password=…'` printed the
/// password in its error. None of the forms a password takes is printed,
/// by `keel backup` (SQLite only) or by a command that fails to connect.
#[test]
fn no_command_prints_a_postgresql_password() {
    let cli = Cli::new();
    let secret = "hunter2-secret";
    for db in [
        format!("postgres://keel@127.0.0.1:1/keel?password={secret}&connect_timeout=1"),
        format!("postgresql://keel:{secret}@127.0.0.1:1/keel?connect_timeout=1"),
        format!("postgres://127.0.0.1:1/keel?sslpassword={secret}&connect_timeout=1"),
        format!("host=127.0.0.1 port=1 connect_timeout=1 password='{secret}'"),
    ] {
        for args in [
            vec!["backup", "--db", db.as_str(), "copy.sqlite3"],
            vec!["sessions", "--db", db.as_str()],
        ] {
            let output = cli.run(&args);
            assert!(!output.status.success(), "{args:?}: {}", stdout(&output));
            let printed = format!("{}{}", stdout(&output), stderr(&output));
            assert!(!printed.contains(secret), "{args:?} printed the password: {printed}");
            assert!(
                printed.contains("visible to every local user"),
                "{args:?} did not warn: {printed}"
            );
        }
    }
    // Given through KEEL_DB, the password is not on the command line: no
    // warning, and still never printed.
    let db = format!("postgres://keel@127.0.0.1:1/keel?password={secret}&connect_timeout=1");
    let output = cli
        .command(&["backup", "copy.sqlite3"])
        .env("KEEL_DB", &db)
        .output()
        .expect("run");
    let printed = format!("{}{}", stdout(&output), stderr(&output));
    assert!(!printed.contains(secret), "{printed}");
    assert!(!printed.contains("visible to every local user"), "{printed}");
    assert!(printed.contains("pg_dump"), "{printed}");
}
