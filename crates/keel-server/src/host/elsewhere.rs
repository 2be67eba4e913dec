//! What a node learnt, claiming a session, of one that another live node
//! runs: which node, until when its lease lasts, and the session's tenant.
//!
//! While the lease lasts, a submission for the session is relayed at once,
//! without reading the session and trying to claim it again (three
//! statements per relayed submission). A hint is only ever a shortcut to
//! the relay: if the owner let the session go early (it unloaded it or shut
//! down), the relayed row is announced with no live owner and any node
//! takes the session over, as after a crash; the hint ends with the lease
//! it was learnt from, so a claim is tried again after that. A session's
//! tenant never changes.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Hints kept at most; past this, expired ones are dropped, and if none
/// were, all of them (they are only shortcuts).
const MAX_HINTS: usize = 65_536;

/// A session another node runs, as this node last learnt.
#[derive(Debug, Clone)]
pub(super) struct Elsewhere {
    /// The session's tenant.
    pub(super) tenant: String,
    /// The node that holds it.
    pub(super) owner: String,
    /// When the lease this was learnt from ends, by this node's clock
    /// (started before the claim was sent, so never later than the store's).
    until: Instant,
}

/// The hints of one node.
#[derive(Default)]
pub(super) struct ElsewhereHints {
    hints: Mutex<HashMap<String, Elsewhere>>,
}

impl ElsewhereHints {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Elsewhere>> {
        self.hints.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Records that node `owner` holds `session_id` (of `tenant`) for
    /// `left` from `asked` (when the claim that learnt it was sent).
    pub(super) fn learn(&self, session_id: &str, tenant: &str, owner: &str, asked: Instant, left: Duration) {
        let mut hints = self.lock();
        if hints.len() >= MAX_HINTS {
            let now = Instant::now();
            hints.retain(|_, hint| hint.until > now);
            if hints.len() >= MAX_HINTS {
                hints.clear();
            }
        }
        hints.insert(
            session_id.to_owned(),
            Elsewhere {
                tenant: tenant.to_owned(),
                owner: owner.to_owned(),
                until: asked + left,
            },
        );
    }

    /// The hint for `session_id` while its lease lasts.
    pub(super) fn get(&self, session_id: &str) -> Option<Elsewhere> {
        let mut hints = self.lock();
        let hint = hints.get(session_id)?;
        if hint.until > Instant::now() {
            return Some(hint.clone());
        }
        hints.remove(session_id);
        None
    }

    /// Forgets `session_id`: this node claimed it, or it is gone.
    pub(super) fn forget(&self, session_id: &str) {
        self.lock().remove(session_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hint_lasts_as_long_as_the_lease_it_was_learnt_from() {
        let hints = ElsewhereHints::default();
        let asked = Instant::now();
        hints.learn("a", "acme", "node-1", asked, Duration::from_secs(60));
        hints.learn("b", "acme", "node-1", asked, Duration::ZERO);
        assert_eq!(
            hints.get("a").map(|hint| (hint.tenant, hint.owner)),
            Some(("acme".to_owned(), "node-1".to_owned()))
        );
        assert!(hints.get("b").is_none(), "an ended lease is no hint");
        assert!(hints.get("c").is_none());
        hints.forget("a");
        assert!(hints.get("a").is_none());
    }

    #[test]
    fn hints_are_bounded() {
        let hints = ElsewhereHints::default();
        let asked = Instant::now();
        for index in 0..MAX_HINTS + 10 {
            hints.learn(&index.to_string(), "t", "n", asked, Duration::from_secs(60));
        }
        assert!(hints.lock().len() <= MAX_HINTS);
        assert!(hints.get(&(MAX_HINTS + 9).to_string()).is_some(), "the newest is kept");
    }
}
