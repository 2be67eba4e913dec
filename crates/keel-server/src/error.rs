//! API errors: one status, one machine code and one human message each.
//!
//! Every error answers `{"error": {"code": "…", "message": "…"}}`. Messages
//! never carry a key or a token: they come from the runtime's and the
//! store's errors, which never hold them either, and are redacted on the way
//! out anyway (see [`keel_secrets`]) in case an upstream echoed one.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use keel_protocol::Error;
use keel_store::StoreError;
use keel_tools::workspace::WorkspaceError;

/// An error answered by the API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// Malformed JSON, unknown fields, bad values, an invalid op (400).
    #[error("{0}")]
    InvalidRequest(String),
    /// A missing or wrong bearer token (401).
    #[error("a valid bearer token is required")]
    Unauthorized,
    /// A credential this server verified that names what no credential
    /// may (401, `unauthorized`): the message says what, to its holder.
    #[error("{0}")]
    CredentialRefused(String),
    /// A request beyond what the operator lets API clients ask for (403);
    /// `code` names the setting (`sandbox_over_ceiling`, …) and the message
    /// the `keel.toml` key or `keel serve` flag that would allow it.
    #[error("{message}")]
    Forbidden {
        /// The machine code.
        code: &'static str,
        /// What was refused and how the operator could allow it.
        message: String,
    },
    /// A principal without the scope the request needs (403): the code
    /// names it (`missing_scope_read`, `…_submit`, `…_approve`, `…_admin`).
    #[error("this request needs the `{0}` scope, which the credentials do not grant")]
    MissingScope(crate::auth::scope::Scope),
    /// A request from a browser page of another origin (403), refused so
    /// no web page can drive the server.
    #[error("{0}")]
    ForbiddenOrigin(String),
    /// An unknown session or route (404).
    #[error("{0}")]
    NotFound(String),
    /// A model spec this server cannot build (404): an unknown provider or
    /// model, or a provider without its key. Not a malformed request: the
    /// server offers no such model.
    #[error("{0}")]
    ModelNotFound(String),
    /// A fork point the parent's history cannot be cut at (409): past the
    /// end of its log, or inside a turn.
    #[error("{0}")]
    InvalidForkPoint(String),
    /// A route that does not take this method (405).
    #[error("this route does not take that method")]
    MethodNotAllowed,
    /// The session's submission queue is full (409).
    #[error("the session's submission queue is full; retry later")]
    QueueFull,
    /// `on_busy: reject` while the session is busy (409).
    #[error("{0}")]
    SessionBusy(String),
    /// The resource exists already (409).
    #[error("{0}")]
    Conflict(String),
    /// A request that does not fit the state it meets (`409`), with its own
    /// code: a front-end protocol's `history_mismatch` and
    /// `call_not_waiting`, `webhook_limit`.
    #[error("{message}")]
    ProtocolConflict {
        /// The machine code.
        code: &'static str,
        /// What does not fit.
        message: String,
    },
    /// A stored session whose model this server cannot build now (409):
    /// the operator changed the server's models since the session was made
    /// (a model beyond a lowered ceiling keeps the ceiling's `403`). The session is kept as it is; a `PATCH` of its
    /// `model` to one the server offers makes it load again.
    #[error("{0}")]
    SessionModelUnavailable(String),
    /// A session's workspace is not a directory Keel created for it (409):
    /// `workspace_exists` when a new session's workspace name is taken,
    /// `workspace_not_keels` when a stored session's workspace was
    /// replaced or may not be adopted, `workspace_not_removable` when a
    /// delete would remove what Keel did not create or its own files.
    /// Nothing was created, loaded or deleted.
    #[error("{message}")]
    Workspace {
        /// The machine code.
        code: &'static str,
        /// What was found, and what the operator can do.
        message: String,
    },
    /// The session runs on another node sharing the database (409). A node
    /// relays submissions to the owner instead; a client sees this only
    /// where relaying cannot help.
    #[error("{0}")]
    Elsewhere(String),
    /// An `Idempotency-Key` sent again with another body (409): answering
    /// it as a duplicate would drop the new request silently. A conflict
    /// with what the key already names, not a fault of the request itself.
    #[error("{0}")]
    KeyReused(String),
    /// A budget of the session or its tenant is spent, or the tenant runs
    /// as many turns as it may at once (429): the body's `budget` says
    /// which, and when it opens again.
    #[error("{0}")]
    BudgetExhausted(Box<crate::budget::window::Exhausted>),
    /// The request body did not arrive within the body timeout (408); the
    /// connection is closed with the answer.
    #[error("{0}")]
    RequestTimeout(String),
    /// The body or the message is over its limit (413).
    #[error("{0}")]
    TooLarge(String),
    /// A JSON body sent with another content type (415): a browser can send
    /// `text/plain` cross-site without asking, `application/json` it cannot.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// A `Host` the server does not answer for (421): DNS rebinding.
    #[error("{0}")]
    MisdirectedRequest(String),
    /// No live session can be unloaded to make room (503).
    #[error("{0}")]
    TooManySessions(String),
    /// The server is shutting down, or the session stopped (503).
    #[error("{0}")]
    Unavailable(String),
    /// The node running the session did not take up a submission relayed
    /// to it in time (503, with `Retry-After`): it is dying or cut off.
    /// The submission stays relayed; a retry with its `Idempotency-Key`
    /// gets its real answer, from any node.
    #[error("{message}")]
    OwnerUnavailable {
        /// What happened.
        message: String,
        /// Seconds until a retry may find the session taken over.
        retry_after_secs: u64,
    },
    /// The database cannot be reached (503): nothing was stored; retry once
    /// it is back (`/readyz` says when).
    #[error("{0}")]
    StoreUnavailable(String),
    /// The disk, or the database's size cap, is full (503): nothing was
    /// stored; retry once space is freed.
    #[error("{0}")]
    StoreFull(String),
    /// A client tool declaration or result the request may not make:
    /// `invalid_client_tool` (400), `client_tool_conflict` (409, the name
    /// of a tool the server runs), `unknown_tool_call` (404, no such call
    /// waits), `tool_call_answered` (409), `client_tool_output_too_large`
    /// (413). Nothing was stored.
    #[error("{message}")]
    ClientTool {
        /// The machine code.
        code: &'static str,
        /// What was refused.
        message: String,
    },
    /// A store failure or another server fault (500).
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidRequest(_) => StatusCode::BAD_REQUEST,
            Self::Unauthorized | Self::CredentialRefused(_) => StatusCode::UNAUTHORIZED,
            Self::Forbidden { .. } | Self::MissingScope(_) => StatusCode::FORBIDDEN,
            Self::ForbiddenOrigin(_) => StatusCode::FORBIDDEN,
            Self::NotFound(_) | Self::ModelNotFound(_) => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::QueueFull
            | Self::SessionBusy(_)
            | Self::Conflict(_)
            | Self::ProtocolConflict { .. }
            | Self::SessionModelUnavailable(_)
            | Self::KeyReused(_)
            | Self::InvalidForkPoint(_)
            | Self::Workspace { .. }
            | Self::Elsewhere(_) => StatusCode::CONFLICT,
            Self::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,

            Self::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::MisdirectedRequest(_) => StatusCode::MISDIRECTED_REQUEST,
            Self::BudgetExhausted(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::TooManySessions(_)
            | Self::Unavailable(_)
            | Self::OwnerUnavailable { .. }
            | Self::StoreUnavailable(_)
            | Self::StoreFull(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::ClientTool { code, .. } => client_tool_status(code),
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The machine code of the body.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidRequest(_) => "invalid_request",
            Self::Unauthorized | Self::CredentialRefused(_) => "unauthorized",
            Self::Forbidden { code, .. } => code,
            Self::MissingScope(scope) => match scope {
                crate::auth::scope::Scope::Read => "missing_scope_read",
                crate::auth::scope::Scope::Submit => "missing_scope_submit",
                crate::auth::scope::Scope::Approve => "missing_scope_approve",
                crate::auth::scope::Scope::Admin => "missing_scope_admin",
            },
            Self::ForbiddenOrigin(_) => "forbidden_origin",
            Self::NotFound(_) => "not_found",
            Self::ModelNotFound(_) => "model_not_found",
            Self::InvalidForkPoint(_) => "invalid_fork_point",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::QueueFull => "queue_full",
            Self::SessionBusy(_) => "session_busy",
            Self::Conflict(_) => "conflict",
            Self::ProtocolConflict { code, .. } => code,
            Self::SessionModelUnavailable(_) => "session_model_unavailable",
            Self::Workspace { code, .. } => code,
            Self::Elsewhere(_) => "session_elsewhere",
            Self::RequestTimeout(_) => "request_timeout",
            Self::TooLarge(_) => "too_large",
            Self::KeyReused(_) => "idempotency_key_reused",
            Self::UnsupportedMediaType(_) => "unsupported_media_type",
            Self::MisdirectedRequest(_) => "misdirected_request",
            Self::BudgetExhausted(_) => "budget_exhausted",
            Self::TooManySessions(_) => "too_many_sessions",
            Self::Unavailable(_) => "unavailable",
            Self::OwnerUnavailable { .. } => "owner_unavailable",
            Self::StoreUnavailable(_) => "store_unavailable",
            Self::StoreFull(_) => "store_full",
            Self::ClientTool { code, .. } => code,
            Self::Internal(_) => "internal",
        }
    }

    /// An unknown session.
    pub(crate) fn unknown_session(session_id: &str) -> Self {
        Self::NotFound(format!("no session '{session_id}'"))
    }

    /// The body of the error, also sent in WebSocket replies.
    pub(crate) fn body(&self) -> ErrorBody {
        ErrorBody {
            code: self.code(),
            message: keel_secrets::redact_owned(self.to_string()),
            budget: match self {
                Self::BudgetExhausted(spent) => Some((**spent).clone()),
                _ => None,
            },
        }
    }
}

/// The status of a client tool error's code.
fn client_tool_status(code: &str) -> StatusCode {
    match code {
        "unknown_tool_call" => StatusCode::NOT_FOUND,
        "client_tool_conflict" | "tool_call_answered" => StatusCode::CONFLICT,
        "client_tool_output_too_large" => StatusCode::PAYLOAD_TOO_LARGE,
        _ => StatusCode::BAD_REQUEST,
    }
}

/// `{"code": …, "message": …}`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorBody {
    /// The machine code (see the Errors table of the API's docs).
    #[schema(value_type = String)]
    pub(crate) code: &'static str,
    /// What went wrong, for people.
    pub(crate) message: String,
    /// With `budget_exhausted`: the limit spent and when it opens again.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::budget::window::Exhausted>)]
    pub(crate) budget: Option<crate::budget::window::Exhausted>,
}

#[derive(Serialize)]
struct Envelope {
    error: ErrorBody,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let Self::Internal(message) = &self {
            let message = keel_secrets::redact(message);
            tracing::error!(%message, "request failed");
        }
        let mut response = (self.status(), Json(Envelope { error: self.body() })).into_response();
        if let Self::OwnerUnavailable { retry_after_secs, .. } = &self {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_secs));
        }
        if matches!(self, Self::Unauthorized | Self::CredentialRefused(_)) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::UnknownSession(id) => Self::unknown_session(&id),
            exists @ StoreError::Exists(_) => Self::Conflict(exists.to_string()),
            owned @ StoreError::Owned { .. } => Self::Elsewhere(owned.to_string()),
            StoreError::Invalid(message) => Self::InvalidRequest(message),
            StoreError::Closed => Self::Unavailable("the store is closed".to_owned()),
            replaced @ StoreError::Replaced(_) => Self::Unavailable(replaced.to_string()),
            unreachable @ StoreError::Unavailable(_) => Self::StoreUnavailable(unreachable.to_string()),
            // A full disk is the operator's to fix, not a fault of the
            // server's: the client is told to come back, as for an outage.
            full @ StoreError::Full(_) => Self::StoreFull(full.to_string()),
            other => Self::Internal(format!("store failed: {other}")),
        }
    }
}

impl From<WorkspaceError> for ApiError {
    fn from(error: WorkspaceError) -> Self {
        let code = match &error {
            WorkspaceError::Exists { .. } => "workspace_exists",
            WorkspaceError::Replaced { .. } => "workspace_not_keels",
            WorkspaceError::NotRemovable { .. } => "workspace_not_removable",
            WorkspaceError::Io { .. } => return Self::Internal(error.to_string()),
        };
        Self::Workspace {
            code,
            message: error.to_string(),
        }
    }
}

impl From<Error> for ApiError {
    fn from(error: Error) -> Self {
        match error {
            Error::InvalidInput(message) => Self::InvalidRequest(message),
            Error::Busy(_) => Self::QueueFull,
            Error::SessionBusy(message) => Self::SessionBusy(message),
            Error::KeyReused(message) => Self::KeyReused(message),
            Error::Stopped(reason) => Self::Unavailable(format!("the session stopped: {reason}")),
            Error::Checkpoint(store) => store.into(),
            Error::Config(message) => Self::InvalidRequest(message),
            other => Self::Internal(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_its_status_and_code() {
        let cases = [
            (ApiError::InvalidRequest("x".into()), 400, "invalid_request"),
            (ApiError::Unauthorized, 401, "unauthorized"),
            (
                ApiError::Forbidden {
                    code: "sandbox_over_ceiling",
                    message: "x".into(),
                },
                403,
                "sandbox_over_ceiling",
            ),
            (ApiError::ForbiddenOrigin("x".into()), 403, "forbidden_origin"),
            (
                ApiError::MissingScope(crate::auth::scope::Scope::Approve),
                403,
                "missing_scope_approve",
            ),
            (ApiError::NotFound("x".into()), 404, "not_found"),
            (ApiError::MethodNotAllowed, 405, "method_not_allowed"),
            (ApiError::QueueFull, 409, "queue_full"),
            (
                ApiError::ProtocolConflict {
                    code: "history_mismatch",
                    message: "x".into(),
                },
                409,
                "history_mismatch",
            ),
            (ApiError::SessionBusy("x".into()), 409, "session_busy"),
            (ApiError::KeyReused("x".into()), 409, "idempotency_key_reused"),
            (ApiError::Conflict("x".into()), 409, "conflict"),
            (ApiError::Elsewhere("x".into()), 409, "session_elsewhere"),
            (ApiError::RequestTimeout("x".into()), 408, "request_timeout"),
            (
                ApiError::Workspace {
                    code: "workspace_exists",
                    message: "x".into(),
                },
                409,
                "workspace_exists",
            ),
            (
                ApiError::SessionModelUnavailable("x".into()),
                409,
                "session_model_unavailable",
            ),
            (ApiError::TooLarge("x".into()), 413, "too_large"),
            (
                ApiError::UnsupportedMediaType("x".into()),
                415,
                "unsupported_media_type",
            ),
            (ApiError::MisdirectedRequest("x".into()), 421, "misdirected_request"),
            (
                ApiError::BudgetExhausted(Box::new(crate::budget::window::Exhausted {
                    applies_to: "tenant",
                    tenant: "acme".into(),
                    session_id: None,
                    limit: "total_tokens",
                    allowed: 1,
                    used: 1,
                    resets_at_ms: None,
                })),
                429,
                "budget_exhausted",
            ),
            (ApiError::TooManySessions("x".into()), 503, "too_many_sessions"),
            (ApiError::Unavailable("x".into()), 503, "unavailable"),
            (
                ApiError::OwnerUnavailable {
                    message: "x".into(),
                    retry_after_secs: 2,
                },
                503,
                "owner_unavailable",
            ),
            (ApiError::StoreUnavailable("x".into()), 503, "store_unavailable"),
            (ApiError::StoreFull("x".into()), 503, "store_full"),
            (ApiError::Internal("x".into()), 500, "internal"),
        ];
        for (error, status, code) in cases {
            assert_eq!((error.status().as_u16(), error.code()), (status, code));
        }
        assert_eq!(
            ApiError::from(Error::Checkpoint(StoreError::UnknownSession("s".into()))),
            ApiError::NotFound("no session 's'".into())
        );
        for (error, code) in [
            (WorkspaceError::Exists { path: "/w/a".into() }, "workspace_exists"),
            (
                WorkspaceError::Replaced {
                    path: "/w/a".into(),
                    why: "x".into(),
                },
                "workspace_not_keels",
            ),
            (
                WorkspaceError::NotRemovable {
                    path: "/w/a".into(),
                    why: "x".into(),
                },
                "workspace_not_removable",
            ),
        ] {
            let error = ApiError::from(error);
            assert_eq!((error.status().as_u16(), error.code()), (409, code));
        }
        let full = ApiError::from(StoreError::Full("database or disk is full".into()));
        assert_eq!((full.status().as_u16(), full.code()), (503, "store_full"));
        let unreachable = ApiError::from(StoreError::Unavailable("disk I/O error".into()));
        assert_eq!(
            (unreachable.status().as_u16(), unreachable.code()),
            (503, "store_unavailable")
        );
    }
}
