//! Who may touch which session: the one check every route of one session
//! makes before anything else.
//!
//! A session belongs to the tenant stored with it (`SessionContext.tenant`).
//! A principal that does not see that tenant is answered exactly as for a
//! session that does not exist: the same `404 not_found` and message
//! ([`ApiError::unknown_session`]), after the same store read, so neither
//! the body, the headers nor the time taken tell the two apart. The scope
//! is checked first, before the session is looked up, so a missing scope is
//! the same `403` whether the session exists or not.

use crate::Server;
use crate::auth::{Principal, Scope};
use crate::error::ApiError;
use keel_store::SessionSummary;

/// The session `id` if `principal` has `scope` and sees it: its stored
/// summary, or `None` for a session that is live on this node but not
/// stored yet (it is being created).
///
/// `403 missing_scope_<scope>` without the scope; `404` (the unknown
/// session's answer) when there is no such session or it belongs to a
/// tenant the principal does not see.
pub(crate) async fn session(
    server: &Server,
    principal: &Principal,
    scope: Scope,
    id: &str,
) -> Result<Option<SessionSummary>, ApiError> {
    principal.require(scope)?;
    // The store is always read, whatever the host holds, so an absent
    // session and another tenant's cost the same work.
    let summary = server.host.store.session_summary(id).await?;
    let visible = match &summary {
        Some(summary) => principal.sees(&summary.context.tenant),
        None => server
            .host
            .live_tenant(id)
            .is_some_and(|tenant| principal.sees(&tenant)),
    };
    if visible {
        Ok(summary)
    } else {
        Err(ApiError::unknown_session(id))
    }
}

/// [`session`] for a submission, which needs no summary: a session whose
/// tenant this node knows right now ([`crate::host::Host::known_tenant`]: it
/// runs the session, or learnt moments ago which node does) is checked
/// against that tenant without a store read, one statement less per
/// submission. A known tenant the principal does not see is checked as
/// [`session`] does, so an absent session and another tenant's still cost
/// the same work. A tenant learnt from another node's lease may be stale
/// (the session was deleted, then made again under the same id); the owner
/// checks the tenant again before it queues a relayed submission.
pub(crate) async fn session_to_submit(
    server: &Server,
    principal: &Principal,
    scope: Scope,
    id: &str,
) -> Result<(), ApiError> {
    principal.require(scope)?;
    if server
        .host
        .known_tenant(id)
        .is_some_and(|tenant| principal.sees(&tenant))
    {
        return Ok(());
    }
    session(server, principal, scope, id).await.map(drop)
}

/// The scope an op needs: `approve` for an approval decision, `admin` for
/// a shutdown (it stops the session's runtime for everyone using it),
/// `submit` for everything else (messages, steering, interrupts,
/// compaction, regeneration).
pub(crate) fn op_scope(op: &keel_protocol::Op) -> Scope {
    match op {
        keel_protocol::Op::Approval { .. } => Scope::Approve,
        keel_protocol::Op::Shutdown => Scope::Admin,
        _ => Scope::Submit,
    }
}

/// The tenant a new session of `principal` belongs to: the one `asked`
/// (checked like a bot id) if the principal may name it, else its own.
/// Only a principal that sees every tenant (the operator) may name another
/// tenant than its own (`403 tenant_forbidden`).
pub(crate) fn new_session_tenant(principal: &Principal, asked: Option<&str>) -> Result<String, ApiError> {
    let own = principal.actor.tenant.as_str();
    let Some(asked) = asked else {
        return Ok(own.to_owned());
    };
    check_tenant(asked)?;
    if principal.tenant_filter().is_some_and(|only| only != asked) {
        return Err(ApiError::Forbidden {
            code: "tenant_forbidden",
            message: "`tenant` may name only the credentials' own tenant".to_owned(),
        });
    }
    Ok(asked.to_owned())
}

/// The id of a new session: the one `asked` when the principal may choose
/// it, else a fresh one. Session ids are one namespace across tenants, so a
/// principal of one tenant that chose an id taken by another tenant would
/// be told it exists (`409`): only a principal that sees every tenant (the
/// operator) may choose one (`403 tenant_forbidden` otherwise).
pub(crate) fn new_session_id(principal: &Principal, asked: Option<String>) -> Result<String, ApiError> {
    match asked {
        None => Ok(keel_protocol::new_id()),
        Some(_) if principal.tenant_filter().is_some() => Err(ApiError::Forbidden {
            code: "tenant_forbidden",
            message: "credentials of one tenant cannot choose a session's `id` (ids are shared by every \
                      tenant, so a chosen one could tell whether another tenant uses it); leave it out to get \
                      a fresh one"
                .to_owned(),
        }),
        Some(id) => Ok(id),
    }
}

/// The session a front-end protocol's thread (the AI SDK's chat `id`,
/// AG-UI's `threadId`) stands for. Those clients choose their own ids, and
/// session ids are one namespace, so for a principal of one tenant the
/// thread lives in that tenant's part of it: `<tenant>~<thread>`, with `~`
/// refused in the thread so two tenants' threads never meet. The operator's
/// thread is the session of that id. The session may not exist yet: the
/// caller creates it under this id, which no other tenant can reach.
#[cfg_attr(not(test), allow(dead_code))] // the protocol routes use it
pub(crate) fn thread_session_id(principal: &Principal, thread: &str) -> Result<String, ApiError> {
    let id = match principal.tenant_filter() {
        None => thread.to_owned(),
        Some(_) if thread.contains('~') => {
            return Err(ApiError::InvalidRequest(
                "a thread id of a tenant's credentials cannot contain `~`".to_owned(),
            ));
        }
        Some(tenant) => format!("{tenant}~{thread}"),
    };
    if thread.is_empty() || !keel_protocol::is_path_name(&id, keel_agent::MAX_SESSION_ID_BYTES) {
        return Err(ApiError::InvalidRequest(format!(
            "a thread id is printable ASCII other than `%`, at most {} bytes with the tenant's prefix",
            keel_agent::MAX_SESSION_ID_BYTES
        )));
    }
    Ok(id)
}

/// Checks a tenant name (given at creation or as a filter) with an API
/// message: the bound of a bot id, since it is stored with each session.
pub(crate) fn check_tenant(tenant: &str) -> Result<(), ApiError> {
    if !keel_config::valid_tenant(tenant) {
        return Err(ApiError::InvalidRequest(format!(
            "`tenant` must be {}",
            keel_config::TENANT_NAME_RULE
        )));
    }
    Ok(())
}

/// The tenant filter of a listing: the principal's own tenant for a
/// principal of one tenant (asking for another finds nothing: `Err(())`),
/// the one asked for, or every tenant (`None`) for the operator.
pub(crate) fn list_tenant<'a>(principal: &'a Principal, asked: Option<&'a str>) -> Result<Option<&'a str>, ()> {
    match (principal.tenant_filter(), asked) {
        (Some(own), Some(asked)) if own != asked => Err(()),
        (Some(own), _) => Ok(Some(own)),
        (None, asked) => Ok(asked),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Scopes;
    use keel_protocol::{ActorKind, Op};

    fn tenant(name: &str) -> Principal {
        Principal::of_tenant(name, "k1", ActorKind::ApiKey, Some("ci".into()), Scopes::ALL)
    }

    #[test]
    fn a_new_sessions_tenant_is_the_principals_unless_the_operator_names_one() {
        let operator = Principal::operator();
        assert_eq!(new_session_tenant(&operator, None), Ok("default".to_owned()));
        assert_eq!(new_session_tenant(&operator, Some("acme")), Ok("acme".to_owned()));
        let acme = tenant("acme");
        assert_eq!(new_session_tenant(&acme, None), Ok("acme".to_owned()));
        assert_eq!(new_session_tenant(&acme, Some("acme")), Ok("acme".to_owned()));
        assert_eq!(
            new_session_tenant(&acme, Some("beta")).map_err(|error| error.code()),
            Err("tenant_forbidden")
        );
        assert_eq!(
            new_session_id(&acme, Some("guessable".into())).map_err(|error| error.code()),
            Err("tenant_forbidden")
        );
        assert!(new_session_id(&acme, None).is_ok_and(|id| !id.is_empty()));
        assert_eq!(
            new_session_id(&operator, Some("chosen".into())),
            Ok("chosen".to_owned())
        );
        for bad in ["", "a\u{e9}", "a\tb"] {
            assert_eq!(
                new_session_tenant(&operator, Some(bad)).map_err(|error| error.code()),
                Err("invalid_request"),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_tenants_threads_live_in_its_own_part_of_the_session_ids() {
        let operator = Principal::operator();
        assert_eq!(thread_session_id(&operator, "chat-1"), Ok("chat-1".to_owned()));
        assert_eq!(
            thread_session_id(&tenant("acme"), "chat-1"),
            Ok("acme~chat-1".to_owned())
        );
        // `a~b`'s thread `c` and `a`'s thread `b~c` would be the same session.
        assert_eq!(thread_session_id(&tenant("a~b"), "c"), Ok("a~b~c".to_owned()));
        assert_eq!(
            thread_session_id(&tenant("a"), "b~c").map_err(|error| error.code()),
            Err("invalid_request")
        );
        for bad in ["", "a\u{e9}", "a\nb", &"x".repeat(124)] {
            assert_eq!(
                thread_session_id(&tenant("acme"), bad).map_err(|error| error.code()),
                Err("invalid_request"),
                "{bad:?}"
            );
        }
        assert!(thread_session_id(&operator, &"x".repeat(128)).is_ok());
    }

    #[test]
    fn a_listing_shows_the_principals_tenant_or_what_the_operator_asks() {
        let operator = Principal::operator();
        assert_eq!(list_tenant(&operator, None), Ok(None));
        assert_eq!(list_tenant(&operator, Some("acme")), Ok(Some("acme")));
        let acme = tenant("acme");
        assert_eq!(list_tenant(&acme, None), Ok(Some("acme")));
        assert_eq!(list_tenant(&acme, Some("acme")), Ok(Some("acme")));
        assert_eq!(list_tenant(&acme, Some("beta")), Err(()));
    }

    #[test]
    fn approvals_need_approve_a_shutdown_admin_and_every_other_op_submit() {
        let approval: Op = serde_json::from_value(serde_json::json!({
            "type": "approval", "call_id": "c1", "decision": "approve"
        }))
        .expect("an approval op");
        assert_eq!(op_scope(&approval), Scope::Approve);
        assert_eq!(op_scope(&Op::Shutdown), Scope::Admin);
        for op in [
            Op::UserInput { text: "hi".into() },
            Op::Steer { text: "hi".into() },
            Op::Compact,
            Op::Regenerate,
        ] {
            assert_eq!(op_scope(&op), Scope::Submit, "{op:?}");
        }
    }
}
