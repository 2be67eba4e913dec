//! A throwaway PostgreSQL cluster on this machine, one per process: the
//! database of the tests, of `keel bench --nodes` and of `keel chaos` when
//! they are not given one.
//!
//! [`LocalPostgres::shared`] runs `initdb` in a temporary directory and starts
//! the server with `pg_ctl` on a free loopback port (its unix socket in the
//! same directory), with trust authentication and `fsync=on`. As root it runs
//! them as the `postgres` user (PostgreSQL refuses to run as root).
//!
//! A static's destructor never runs, so the server is stopped by a watchdog
//! instead: a small shell process started before the server, reading its
//! standard input from a pipe whose write end only this process holds. When
//! this process ends, however it ends (a normal exit, a panic, SIGKILL), the
//! kernel closes the pipe; the watchdog reads end-of-file, stops the server
//! with `pg_ctl stop -m immediate` and removes the directory. It ignores
//! SIGINT, SIGTERM and SIGHUP, so a Ctrl-C of `cargo test` reaches it only
//! through that end-of-file.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// The environment variable that makes a missing PostgreSQL a failure (CI
/// sets it): tests must run there, not skip.
pub const REQUIRE_ENV: &str = "KEEL_REQUIRE_POSTGRES_TESTS";

/// The binaries a local server needs.
const NEEDED: [&str; 3] = ["initdb", "pg_ctl", "postgres"];

/// A throwaway PostgreSQL server started by this process (for its tests, a
/// benchmark or a chaos run), stopped when the process ends.
pub struct LocalPostgres {
    /// The temporary directory holding the data directory, the socket and
    /// the server log; removed by the watchdog.
    base: PathBuf,
    /// The data directory.
    data: PathBuf,
    /// The directory of the PostgreSQL binaries used.
    bin: PathBuf,
    /// The loopback TCP port.
    port: u16,
    /// Whether commands run as the `postgres` user (this process is root).
    as_postgres: bool,
    /// Directories the server also puts its Unix socket in (see
    /// [`Self::own_with_sockets_in`]).
    socket_directories: Vec<PathBuf>,
    /// Numbers the databases of [`Self::fresh_database`].
    next_database: AtomicU64,
    /// The watchdog; its stdin pipe closes when this process ends.
    watchdog: Mutex<Child>,
}

impl std::fmt::Debug for LocalPostgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalPostgres")
            .field("data", &self.data)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

static SHARED: OnceLock<Option<LocalPostgres>> = OnceLock::new();

impl LocalPostgres {
    /// This test process's server, started on first use. `None`, after one
    /// loud `SKIPPED: PostgreSQL tests (…)` line on stderr, when the
    /// PostgreSQL binaries cannot be found; panics instead when
    /// `KEEL_REQUIRE_POSTGRES_TESTS=1`, and whenever the binaries are there
    /// but the server does not start (that is a failure, not a skip).
    pub fn shared() -> Option<&'static LocalPostgres> {
        SHARED
            .get_or_init(|| {
                let bin = match find_binaries() {
                    Ok(bin) => bin,
                    Err(why) if required() => panic!("PostgreSQL tests are required ({REQUIRE_ENV}=1): {why}"),
                    Err(why) => {
                        eprintln!("SKIPPED: PostgreSQL tests ({why}; set {REQUIRE_ENV}=1 to make this a failure)");
                        return None;
                    }
                };
                match Self::launch(bin, Vec::new()) {
                    Ok(server) => Some(server),
                    Err(why) => panic!("cannot start the test PostgreSQL server: {why}"),
                }
            })
            .as_ref()
    }

    /// A server of the caller's own, stopped and removed when dropped: for
    /// tests that stop and start it, which would disturb the other tests on
    /// [`Self::shared`]. `None` (after the same `SKIPPED` line) when the
    /// binaries cannot be found; panics as [`Self::shared`] does otherwise.
    pub fn own() -> Option<LocalPostgres> {
        Self::own_with(Vec::new())
    }

    /// A server of the caller's own (as [`Self::own`]) that also listens on
    /// a Unix socket in each of `directories`, as a packaged server does in
    /// `/run/postgresql`: for tests of who can reach those sockets. As root,
    /// the `postgres` user must be able to write them (directories the test
    /// created are handed to it; `/run/postgresql` is its own).
    pub fn own_with_sockets_in(directories: &[PathBuf]) -> Option<LocalPostgres> {
        Self::own_with(directories.to_vec())
    }

    /// A server of the caller's own, as [`Self::own`], for a program rather
    /// than a test (`keel chaos`): what goes wrong is an error, never a
    /// panic or a skip.
    pub fn launch_own() -> Result<LocalPostgres, String> {
        Self::launch(find_binaries()?, Vec::new())
    }

    /// The directories holding the server's Unix socket (`.s.PGSQL.<port>`):
    /// its own temporary directory first.
    pub fn socket_directories(&self) -> Vec<PathBuf> {
        let mut all = vec![self.base.clone()];
        all.extend(self.socket_directories.iter().cloned());
        all
    }

    fn own_with(socket_directories: Vec<PathBuf>) -> Option<LocalPostgres> {
        let bin = match find_binaries() {
            Ok(bin) => bin,
            Err(why) if required() => panic!("PostgreSQL tests are required ({REQUIRE_ENV}=1): {why}"),
            Err(why) => {
                eprintln!("SKIPPED: PostgreSQL tests ({why}; set {REQUIRE_ENV}=1 to make this a failure)");
                return None;
            }
        };
        match Self::launch(bin, socket_directories) {
            Ok(server) => Some(server),
            Err(why) => panic!("cannot start the test PostgreSQL server: {why}"),
        }
    }

    /// Creates a new empty database (`keel_<n>`) and returns its URL;
    /// panics if it cannot (for tests; see [`Self::try_fresh_database`]).
    pub fn fresh_database(&self) -> String {
        self.try_fresh_database().unwrap_or_else(|why| panic!("{why}"))
    }

    /// Creates a new empty database (`keel_<n>`) and returns its URL.
    pub fn try_fresh_database(&self) -> Result<String, String> {
        let number = self.next_database.fetch_add(1, Ordering::Relaxed);
        let name = format!("keel_{number}");
        let output = Command::new(self.bin.join("createdb"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "postgres", &name])
            .stdin(Stdio::null())
            .output()
            .map_err(|error| format!("cannot run createdb: {error}"))?;
        if !output.status.success() {
            return Err(format!(
                "createdb {name} failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        Ok(self.url(&name))
    }

    /// Writes a plain-SQL dump of the database at `url` (one of this
    /// server's) to `to`, with `pg_dump`: the evidence of a failed run.
    pub fn dump(&self, url: &str, to: &std::path::Path) -> Result<(), String> {
        let output = Command::new(self.bin.join("pg_dump"))
            .args(["--no-owner", "--file"])
            .arg(to)
            .arg(url)
            .stdin(Stdio::null())
            .output()
            .map_err(|error| format!("cannot run pg_dump: {error}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "pg_dump failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    }

    /// A command running the PostgreSQL client program `program`
    /// (`pg_dump`, `pg_restore`, `psql`) of this server's version: backups
    /// taken and restored as an operator would.
    pub fn client(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin.join(program));
        command.stdin(Stdio::null());
        command
    }

    /// The URL of database `name` on this server.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// The server's loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server (fast shutdown: connections are closed), for outage
    /// tests. Panics if it does not stop.
    pub fn stop(&self) {
        self.try_stop().unwrap_or_else(|why| panic!("{why}"));
    }

    /// Stops the server (fast shutdown), or says why it did not.
    pub fn try_stop(&self) -> Result<(), String> {
        self.pg_ctl(&["stop", "-m", "fast", "-w"])
    }

    /// Stops the server abruptly (`pg_ctl stop -m immediate`: no
    /// checkpoint, connections cut, crash recovery at the next start), for
    /// crash tests. Panics if it does not stop.
    pub fn stop_immediate(&self) {
        self.pg_ctl(&["stop", "-m", "immediate", "-w"])
            .unwrap_or_else(|why| panic!("{why}"));
    }

    /// Starts the server again after [`Self::stop`]. Panics if it does not
    /// start.
    pub fn start(&self) {
        self.try_start().unwrap_or_else(|why| panic!("{why}"));
    }

    /// Starts the server again after [`Self::try_stop`], or says why it did
    /// not.
    pub fn try_start(&self) -> Result<(), String> {
        let log = self.base.join("server.log");
        self.pg_ctl(&["start", "-w", "-t", "60", "-l", &log.to_string_lossy()])
    }

    fn launch(bin: PathBuf, socket_directories: Vec<PathBuf>) -> Result<Self, String> {
        let as_postgres = nix::unistd::geteuid().is_root();
        let base = tempfile::Builder::new()
            .prefix("keel-pg-")
            .tempdir()
            .map_err(|error| format!("cannot make a temporary directory: {error}"))?
            .keep();
        if as_postgres {
            let user = nix::unistd::User::from_name("postgres")
                .map_err(|error| format!("cannot look up the postgres user: {error}"))?
                .ok_or("running as root and there is no `postgres` user to run PostgreSQL as")?;
            nix::unistd::chown(&base, Some(user.uid), Some(user.gid))
                .map_err(|error| format!("cannot hand {} to postgres: {error}", base.display()))?;
            for dir in &socket_directories {
                let owner = std::fs::metadata(dir).map(|metadata| std::os::unix::fs::MetadataExt::uid(&metadata));
                if owner.is_ok_and(|owner| owner == 0) {
                    nix::unistd::chown(dir, Some(user.uid), Some(user.gid))
                        .map_err(|error| format!("cannot hand {} to postgres: {error}", dir.display()))?;
                }
            }
        }
        let data = base.join("data");
        let watchdog = start_watchdog(&bin, &data, &base, as_postgres)?;
        let mut server = Self {
            base,
            data,
            bin,
            port: 0,
            as_postgres,
            socket_directories,
            next_database: AtomicU64::new(1),
            watchdog: Mutex::new(watchdog),
        };
        server.run(
            "initdb",
            &[
                "-D",
                &server.data.to_string_lossy(),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ],
        )?;
        // A port can be taken between choosing it and the server binding
        // it; try a few.
        let mut last = String::new();
        for _ in 0..5 {
            server.port = free_port()?;
            server.configure()?;
            let log = server.base.join("server.log");
            match server.run(
                "pg_ctl",
                &[
                    "-D",
                    &server.data.to_string_lossy(),
                    "start",
                    "-w",
                    "-t",
                    "60",
                    "-l",
                    &log.to_string_lossy(),
                ],
            ) {
                Ok(()) => return Ok(server),
                Err(why) => {
                    let tail = std::fs::read_to_string(&log).unwrap_or_default();
                    last = format!("{why}\n{tail}");
                }
            }
        }
        Err(last)
    }

    /// Writes the server's settings (appended last, so they win).
    fn configure(&self) -> Result<(), String> {
        let sockets: Vec<String> = self
            .socket_directories()
            .iter()
            .map(|dir| dir.display().to_string())
            .collect();
        let settings = format!(
            "\n# keel test server\nport = {}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             fsync = on\nsynchronous_commit = on\nshared_buffers = 16MB\nmax_connections = 200\n",
            self.port,
            sockets.join(",")
        );
        std::fs::OpenOptions::new()
            .append(true)
            .open(self.data.join("postgresql.conf"))
            .and_then(|mut file| file.write_all(settings.as_bytes()))
            .map_err(|error| format!("cannot write postgresql.conf: {error}"))
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<(), String> {
        let data = self.data.to_string_lossy();
        let mut all = vec!["-D", &data];
        all.extend_from_slice(args);
        self.run("pg_ctl", &all)
            .map_err(|why| format!("pg_ctl {args:?} failed: {why}"))
    }

    /// Runs one of the PostgreSQL binaries (as `postgres` when root).
    fn run(&self, program: &str, args: &[&str]) -> Result<(), String> {
        let output = as_user(&self.bin.join(program), self.as_postgres)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|error| format!("cannot run {program}: {error}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{program} failed ({}): {}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout).trim(),
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    }
}

impl Drop for LocalPostgres {
    /// Closes the watchdog's pipe and waits for it: it stops the server and
    /// removes its directory. (The shared server, in a static, is never
    /// dropped; its watchdog acts when the process ends.)
    fn drop(&mut self) {
        let watchdog = self.watchdog.get_mut().unwrap_or_else(|poison| poison.into_inner());
        drop(watchdog.stdin.take());
        let _ = watchdog.wait();
    }
}

/// Whether `KEEL_REQUIRE_POSTGRES_TESTS=1`.
fn required() -> bool {
    std::env::var(REQUIRE_ENV).is_ok_and(|value| value == "1")
}

/// A command running `program`, as the `postgres` user when `as_postgres`.
fn as_user(program: &Path, as_postgres: bool) -> Command {
    if as_postgres {
        let mut command = Command::new("runuser");
        // The caller's directory may be closed to `postgres`.
        command.current_dir("/").args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

/// Starts the process that stops the server and removes `base` once this
/// process is gone (see the module docs).
fn start_watchdog(bin: &Path, data: &Path, base: &Path, as_postgres: bool) -> Result<Child, String> {
    const SCRIPT: &str = "trap '' INT TERM HUP; cat >/dev/null; \
                          \"$0\" -D \"$1\" stop -m immediate >/dev/null 2>&1; rm -rf \"$2\"";
    let mut command = as_user(Path::new("sh"), as_postgres);
    command
        .arg("-c")
        .arg(SCRIPT)
        .arg(bin.join("pg_ctl"))
        .arg(data)
        .arg(base)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
        .spawn()
        .map_err(|error| format!("cannot start the server's watchdog: {error}"))
}

/// The directory holding `initdb`, `pg_ctl` and `postgres`: on `PATH`, in
/// Debian's `/usr/lib/postgresql/<version>/bin` (newest first), or in
/// `/usr/local/bin`.
fn find_binaries() -> Result<PathBuf, String> {
    let mut candidates: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect())
        .unwrap_or_default();
    let mut debian: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| entries.flatten().map(|entry| entry.path().join("bin")).collect())
        .unwrap_or_default();
    debian.sort_by_key(|path| {
        std::cmp::Reverse(
            path.parent()
                .and_then(Path::file_name)
                .and_then(|name| name.to_str())
                .and_then(|name| name.parse::<u32>().ok())
                .unwrap_or(0),
        )
    });
    candidates.extend(debian);
    candidates.push(PathBuf::from("/usr/local/bin"));
    candidates
        .into_iter()
        .find(|dir| NEEDED.iter().all(|name| dir.join(name).is_file()))
        .map(|dir| {
            std::fs::canonicalize(dir.join("initdb"))
                .ok()
                .and_then(|initdb| initdb.parent().map(Path::to_path_buf))
                .unwrap_or(dir)
        })
        .ok_or_else(|| {
            "no initdb, pg_ctl and postgres found on PATH, in /usr/lib/postgresql/*/bin or /usr/local/bin \
             (install Debian's `postgresql` package)"
                .to_owned()
        })
}

/// A loopback port that was free a moment ago.
fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .map_err(|error| format!("cannot find a free port: {error}"))
}
