//! Seals on relayed submissions, so that a row in the database decides
//! nothing no node accepted from an authenticated client.
//!
//! A node that relays a submission stores it in the database for the
//! session's owner ([`keel_store::CheckpointStore::relay`]). Whoever can
//! write that table (a leaked database password, a process reaching the
//! database's socket) could otherwise insert an `approval` for another
//! session's pending call and have the owner act on it. So the accepting
//! node seals each row with an HMAC-SHA256 over everything the owner acts
//! on (the session, the submission's id and key, the op and its busy
//! policy, and who sent it: the principal it is recorded as), under a key the nodes share and the database never holds
//! (`--cluster-key-file`, or derived from the API token every node
//! checks); the owner refuses a row whose seal does not verify.
//!
//! Every node of a cluster has a key (`keel serve` makes one per host when
//! it is given none, see `cluster_key.rs` of the binary), and nothing whose
//! seal does not verify is acted on, by either path.
//!
//! Not covered: a sealed row copied back in after it was taken up runs
//! again only if it has no idempotency key (a keyed one is a duplicate).

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use keel_store::RelayedSubmission;

/// Binds a key to this use, and a seal to the layout of its message.
const KEY_LABEL: &[u8] = b"keel relayed submissions v1";

/// The key relayed submissions are sealed with, shared by every node of a
/// database and kept out of it.
#[derive(Clone)]
pub struct RelayKey([u8; 32]);

impl RelayKey {
    /// The key derived from a shared secret: the contents of
    /// `--cluster-key-file`, or the API token every node checks.
    pub fn derive(secret: &[u8]) -> Self {
        Self(mac(secret, &[KEY_LABEL]))
    }

    /// The seal of `submission` for `session_id`, as stored with it.
    pub(crate) fn seal(&self, session_id: &str, submission: &RelayedSubmission) -> Option<String> {
        let message = sealed_message(session_id, submission)?;
        Some(to_hex(&mac(&self.0, &[&message])))
    }

    /// Whether `submission` carries a seal that this key made for it and
    /// `session_id`; compared in constant time.
    pub(crate) fn verify(&self, session_id: &str, submission: &RelayedSubmission) -> bool {
        let Some(message) = sealed_message(session_id, submission) else {
            return false;
        };
        self.verify_parts(submission.seal.as_deref(), &[&message])
    }

    /// The seal of `submission` for `session_id` handed to its owner
    /// directly, sent at `sent_at_ms`: labelled apart from a stored row's
    /// (neither passes for the other) and covering when it was sent, so a
    /// copy is refused once it is stale (see `forward.rs`).
    pub(crate) fn seal_forward(
        &self,
        session_id: &str,
        submission: &RelayedSubmission,
        sent_at_ms: u64,
    ) -> Option<String> {
        let message = sealed_message(session_id, submission)?;
        let sent = sent_at_ms.to_be_bytes();
        Some(to_hex(&mac(&self.0, &[FORWARD_LABEL, &sent, &message])))
    }

    /// Whether a submission handed over directly carries the seal
    /// [`Self::seal_forward`] made for it, `session_id` and `sent_at_ms`.
    pub(crate) fn verify_forward(&self, session_id: &str, submission: &RelayedSubmission, sent_at_ms: u64) -> bool {
        let Some(message) = sealed_message(session_id, submission) else {
            return false;
        };
        let sent = sent_at_ms.to_be_bytes();
        self.verify_parts(submission.seal.as_deref(), &[FORWARD_LABEL, &sent, &message])
    }

    /// Whether `seal` is the MAC of `parts` under this key, compared in
    /// constant time.
    fn verify_parts(&self, seal: Option<&str>, parts: &[&[u8]]) -> bool {
        let Some(tag) = seal.and_then(from_hex) else {
            return false;
        };
        let Ok(mut check) = Hmac::<Sha256>::new_from_slice(&self.0) else {
            return false;
        };
        for part in parts {
            check.update(part);
        }
        check.verify_slice(&tag).is_ok()
    }
}

/// Sets a handed-over submission's seal apart from a stored row's, whose
/// message starts with `[`.
const FORWARD_LABEL: &[u8] = b"forwarded\0";

impl fmt::Debug for RelayKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RelayKey([redacted])")
    }
}

/// What a seal covers: everything the owner acts on, in one unambiguous
/// encoding (a JSON array: strings are quoted, so no field can run into
/// the next).
///
/// A submission without a principal is sealed as before principals existed
/// (five fields), so rows relayed by an older node still verify; one with a
/// principal has it as a sixth, so it can be neither dropped nor replaced;
/// one with a `traceparent` has the principal (or `null`) and it as the
/// sixth and seventh.
fn sealed_message(session_id: &str, submission: &RelayedSubmission) -> Option<Vec<u8>> {
    let fields = (
        session_id,
        &submission.submission_id,
        &submission.idempotency_key,
        &submission.op,
        &submission.on_busy,
    );
    match (&submission.submitted_by, &submission.traceparent) {
        (None, None) => serde_json::to_vec(&fields),
        (Some(actor), None) => serde_json::to_vec(&(fields.0, fields.1, fields.2, fields.3, fields.4, actor)),
        (actor, Some(traceparent)) => {
            serde_json::to_vec(&(fields.0, fields.1, fields.2, fields.3, fields.4, actor, traceparent))
        }
    }
    .ok()
}

/// HMAC-SHA256 of the concatenated `parts` under `key`.
fn mac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC takes keys of any length; this cannot fail.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        return [0; 32];
    };
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(text.get(at..at + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_protocol::{ApprovalDecision, Op};

    fn approval(call_id: &str) -> RelayedSubmission {
        RelayedSubmission {
            relay_id: 7,
            submission_id: "sub-1".into(),
            op: Op::Approval {
                call_id: call_id.into(),
                decision: ApprovalDecision::Approve,
            },
            on_busy: None,
            idempotency_key: Some("key-1".into()),
            submitted_by: None,
            seal: None,
            traceparent: None,
        }
    }

    #[test]
    fn a_seal_verifies_only_for_what_it_sealed_under_its_key() {
        let key = RelayKey::derive(b"the token");
        let mut sealed = approval("call-1");
        sealed.seal = key.seal("s", &sealed);
        assert!(key.verify("s", &sealed));
        // The store's own id is not sealed: the row may be renumbered.
        assert!(key.verify(
            "s",
            &RelayedSubmission {
                relay_id: 8,
                ..sealed.clone()
            }
        ));

        let other_key = RelayKey::derive(b"another token");
        assert!(!other_key.verify("s", &sealed), "another cluster's key");
        assert!(!key.verify("t", &sealed), "moved to another session");
        let mut changed = approval("call-2");
        changed.seal = sealed.seal.clone();
        assert!(!key.verify("s", &changed), "another call decided");
        let mut rekeyed = sealed.clone();
        rekeyed.idempotency_key = None;
        assert!(!key.verify("s", &rekeyed), "its key dropped");
        let mut renamed = sealed.clone();
        renamed.submission_id = "sub-2".into();
        assert!(!key.verify("s", &renamed), "another submission id");
        let mut impersonated = sealed.clone();
        impersonated.submitted_by = Some(keel_protocol::Actor::operator("s"));
        assert!(!key.verify("s", &impersonated), "another principal claimed");
        let mut sealed_by = approval("call-1");
        sealed_by.submitted_by = Some(keel_protocol::Actor {
            tenant: "acme".into(),
            principal_id: "key-7".into(),
            kind: keel_protocol::ActorKind::ApiKey,
            name: Some("ci".into()),
        });
        sealed_by.seal = key.seal("s", &sealed_by);
        assert!(key.verify("s", &sealed_by));
        let mut renamed_principal = sealed_by.clone();
        if let Some(actor) = renamed_principal.submitted_by.as_mut() {
            actor.name = Some("admin".into());
        }
        assert!(!key.verify("s", &renamed_principal), "the principal's name changed");
        sealed_by.submitted_by = None;
        assert!(!key.verify("s", &sealed_by), "its principal dropped");
        for forged in [None, Some(String::new()), Some("zz".into()), Some("00".repeat(32))] {
            let row = RelayedSubmission {
                seal: forged.clone(),
                ..sealed.clone()
            };
            assert!(!key.verify("s", &row), "{forged:?}");
        }
    }

    #[test]
    fn a_forward_seal_covers_when_it_was_sent_and_is_no_row_seal() {
        let key = RelayKey::derive(b"the token");
        let mut handed = approval("call-1");
        handed.seal = key.seal_forward("s", &handed, 1_000);
        assert!(key.verify_forward("s", &handed, 1_000));
        assert!(!key.verify_forward("s", &handed, 1_001), "sent at another time");
        assert!(!key.verify_forward("t", &handed, 1_000), "another session");
        assert!(!key.verify("s", &handed), "a forward's seal is no stored row's");
        assert!(!RelayKey::derive(b"another").verify_forward("s", &handed, 1_000));
        let mut stored = approval("call-1");
        stored.seal = key.seal("s", &stored);
        assert!(
            !key.verify_forward("s", &stored, 1_000),
            "a stored row's seal is no forward's"
        );
    }

    #[test]
    fn keys_never_print() {
        let key = RelayKey::derive(b"secret material");
        assert_eq!(format!("{key:?}"), "RelayKey([redacted])");
    }
}
