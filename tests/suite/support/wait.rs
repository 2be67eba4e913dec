//! Waiting for a condition instead of sleeping a fixed time: a test polls
//! the state it needs, with a bound, and fails naming what it waited for.
//! A fixed sleep is either too short on a loaded machine (a flaky test) or
//! longer than needed everywhere else (a slow one).

use std::future::Future;
use std::time::{Duration, Instant};

/// How long any single wait may take before the test is declared hung.
/// Only a guard against hangs; no test asserts on timing.
pub(crate) const HANG_GUARD: Duration = Duration::from_secs(30);

/// The longest pause between two looks at the state. Polls start faster
/// (1 ms, doubling) so that a condition met at once costs next to nothing.
const MAX_POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Awaits `future`, failing the test if it does not finish within [`HANG_GUARD`].
pub(crate) async fn guard<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(HANG_GUARD, future)
        .await
        .unwrap_or_else(|_| panic!("hung: {what}"))
}

/// The pauses of one poll: 1 ms, then doubling up to [`MAX_POLL_INTERVAL`].
struct Backoff(Duration);

impl Backoff {
    fn new() -> Self {
        Self(Duration::from_millis(1))
    }

    fn next(&mut self) -> Duration {
        let pause = self.0;
        self.0 = (self.0 * 2).min(MAX_POLL_INTERVAL);
        pause
    }
}

/// A poll loop written out by its caller, where a closure will not do
/// (a task that must be `Send` and awaits borrowed state, say): call
/// [`Patience::pause`] between two looks.
pub(crate) struct Patience {
    what: String,
    timeout: Duration,
    deadline: Instant,
    backoff: Backoff,
}

impl Patience {
    /// Patience for `what`, running out after `timeout`.
    pub(crate) fn new(what: impl Into<String>, timeout: Duration) -> Self {
        Self {
            what: what.into(),
            timeout,
            deadline: Instant::now() + timeout,
            backoff: Backoff::new(),
        }
    }

    /// Pauses before the next look; fails the test once time is up.
    pub(crate) async fn pause(&mut self) {
        assert!(
            Instant::now() < self.deadline,
            "timed out after {:?} waiting for {}",
            self.timeout,
            self.what
        );
        tokio::time::sleep(self.backoff.next()).await;
    }
}

/// Calls `check` until it gives a value or `timeout` has passed (then
/// `None`), blocking the thread in between. For a caller that must clean
/// up before it fails; otherwise [`wait_for`].
pub(crate) fn poll_for<T>(timeout: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    let mut backoff = Backoff::new();
    loop {
        if let Some(value) = check() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(backoff.next());
    }
}

/// Calls `check` until it gives a value, blocking the thread in between;
/// fails the test naming `what` after `timeout`.
pub(crate) fn wait_for<T>(what: &str, timeout: Duration, check: impl FnMut() -> Option<T>) -> T {
    poll_for(timeout, check).unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}"))
}

/// Blocks until `ready` holds; fails the test naming `what` after `timeout`.
pub(crate) fn wait_until(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
    wait_for(what, timeout, || ready().then_some(()));
}

/// [`poll_for`] for a check that awaits: `None` once `timeout` has passed.
pub(crate) async fn poll_for_async<T>(timeout: Duration, mut check: impl AsyncFnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    let mut backoff = Backoff::new();
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(backoff.next()).await;
    }
}

/// [`wait_for`] for a check that awaits.
pub(crate) async fn wait_for_async<T>(what: &str, timeout: Duration, check: impl AsyncFnMut() -> Option<T>) -> T {
    poll_for_async(timeout, check)
        .await
        .unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}"))
}

/// [`wait_until`] for a condition that awaits.
pub(crate) async fn wait_until_async(what: &str, timeout: Duration, mut ready: impl AsyncFnMut() -> bool) {
    wait_for_async(what, timeout, async || ready().await.then_some(())).await;
}

/// Waits until the wall clock in milliseconds (the one stores stamp rows
/// with) has moved past its value now: what is stamped after this returns
/// is strictly later than what was stamped before it was called.
pub(crate) fn next_millisecond() {
    let now = keel::protocol::now_ms();
    wait_until("the clock to tick", HANG_GUARD, || keel::protocol::now_ms() > now);
}

/// Waits until `flag` is set, yielding to the runtime in between; fails
/// the test naming `what` after [`HANG_GUARD`].
pub(crate) async fn wait_for_flag(what: &str, flag: &std::sync::atomic::AtomicBool) {
    wait_until_async(what, HANG_GUARD, async || {
        flag.load(std::sync::atomic::Ordering::SeqCst)
    })
    .await;
}
