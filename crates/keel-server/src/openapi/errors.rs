//! The error answers of the description: every machine code with its
//! status, and for each route the codes it can answer, grouped by status
//! into responses whose `code` is an enum of exactly those codes.

use std::collections::BTreeMap;

use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{AllOfBuilder, ObjectBuilder, Schema, Type};
use utoipa::openapi::{Ref, RefOr, Response};

/// Every machine code the API answers with, its status and when. The
/// Errors table of `docs/http-api.md` lists the same (a test compares).
pub(crate) const CATALOGUE: &[(&str, u16, &str)] = &[
    (
        "invalid_request",
        400,
        "Malformed JSON, unknown fields, bad values or an invalid op.",
    ),
    ("unauthorized", 401, "A missing or wrong bearer token."),
    (
        "sandbox_over_ceiling",
        403,
        "`tools.sandbox` looser than the server allows clients.",
    ),
    (
        "auto_approval_over_ceiling",
        403,
        "Approvals that would make a tool `auto` beyond the ceiling.",
    ),
    (
        "network_over_ceiling",
        403,
        "`tools.network: true` on a server that does not allow it.",
    ),
    ("tool_over_ceiling", 403, "A tool the server's keel.toml turns off."),
    (
        "script_model_over_ceiling",
        403,
        "A `script:` model outside the server's script directory.",
    ),
    ("forbidden_origin", 403, "A browser request from another origin."),
    ("missing_scope_read", 403, "Credentials without the `read` scope."),
    ("missing_scope_submit", 403, "Credentials without the `submit` scope."),
    ("missing_scope_approve", 403, "Credentials without the `approve` scope."),
    ("missing_scope_admin", 403, "Credentials without the `admin` scope."),
    (
        "tenant_forbidden",
        403,
        "Credentials of one tenant naming another tenant, or choosing an `id`, for a new session; a key for the operator's tenant `default` unless `[auth] allow_default_tenant`.",
    ),
    (
        "webhook_url_refused",
        403,
        "A webhook endpoint's URL the server's `[webhooks]` settings refuse: not `https` (unless allowed), with credentials, a private, loopback or link-local address, or one that does not parse.",
    ),
    ("not_found", 404, "An unknown session or route."),
    (
        "model_not_found",
        404,
        "A model spec this server cannot build (unknown provider or model, no key).",
    ),
    ("method_not_allowed", 405, "A known route with another method."),
    ("queue_full", 409, "The session's submission queue is full."),
    (
        "webhook_limit",
        409,
        "The server keeps as many webhook endpoints as it may (1,000); delete one first.",
    ),
    (
        "session_busy",
        409,
        "`on_busy: reject` while a turn runs or input is queued.",
    ),
    ("conflict", 409, "A session with that id exists."),
    (
        "history_mismatch",
        409,
        "AG-UI: the request's messages are not the session's history; the message names the first difference.",
    ),
    (
        "call_not_waiting",
        409,
        "AG-UI: a resume entry or tool message answers a tool call that does not wait for an answer.",
    ),
    (
        "invalid_fork_point",
        409,
        "A fork point past the parent's log or inside a turn.",
    ),
    (
        "workspace_exists",
        409,
        "The new session's workspace name is taken by something Keel did not create.",
    ),
    (
        "workspace_not_keels",
        409,
        "A stored session's workspace is not the directory Keel created.",
    ),
    (
        "workspace_not_removable",
        409,
        "A workspace delete that would remove what Keel did not create.",
    ),
    (
        "session_elsewhere",
        409,
        "The session runs on another node and the request cannot be handed to it.",
    ),
    (
        "session_model_unavailable",
        409,
        "A stored session whose model this server no longer offers; `PATCH` its `model` to load it again.",
    ),
    (
        "request_timeout",
        408,
        "The body did not arrive within the body timeout.",
    ),
    ("too_large", 413, "The body or the message is over its limit."),
    ("unsupported_media_type", 415, "A body not sent as `application/json`."),
    ("misdirected_request", 421, "A `Host` the server does not answer for."),
    (
        "budget_exhausted",
        429,
        "A token budget of the session or its tenant is spent, or the tenant runs its most concurrent turns; `budget` says which and when it resets.",
    ),
    (
        "idempotency_key_reused",
        409,
        "An `Idempotency-Key` used before on this session for another request.",
    ),
    (
        "too_many_sessions",
        503,
        "The live-session bound is reached and none can be unloaded.",
    ),
    (
        "unavailable",
        503,
        "The server is shutting down, or the session stopped.",
    ),
    (
        "store_unavailable",
        503,
        "The database cannot be reached or written; nothing was stored.",
    ),
    (
        "store_full",
        503,
        "The disk or the database's size cap is full; nothing was stored.",
    ),
    (
        "owner_unavailable",
        503,
        "Several nodes: the node running the session did not take the submission up in time; retry with the same key.",
    ),
    (
        "invalid_client_tool",
        400,
        "A `client_tools` declaration with a bad name, a schema that is not an object schema, or too many or too large.",
    ),
    (
        "client_tool_conflict",
        409,
        "A client tool with the name of a tool the server runs (built-in or MCP), or a name declared twice.",
    ),
    (
        "unknown_tool_call",
        404,
        "A `client_tool_result` for a call that is not waiting for the client.",
    ),
    (
        "tool_call_answered",
        409,
        "A `client_tool_result` for a call answered already (by the client, a timeout or an interrupt).",
    ),
    (
        "client_tool_output_too_large",
        413,
        "A `client_tool_result` whose output is over 256 KiB.",
    ),
    ("internal", 500, "A store failure or another server fault."),
];

/// The codes any request can get, whatever its route: the front door's
/// refusals (a foreign `Host` or `Origin`, a malformed head, a body too
/// large or too slow) and the server's fault.
const FRONT_DOOR: &[&str] = &[
    "invalid_request",
    "forbidden_origin",
    "misdirected_request",
    "request_timeout",
    "too_large",
    "internal",
];

/// The codes every route under the token can answer besides the front
/// door's: the token's refusal and the store's failures.
const BEHIND_THE_TOKEN: &[&str] = &["unauthorized", "store_unavailable", "store_full"];

/// No codes beyond the ones every route can answer.
pub(crate) const NONE: &[&str] = &[];

/// The codes of a route that reads a JSON body.
pub(crate) const BODY: &[&str] = &[
    "invalid_request",
    "request_timeout",
    "too_large",
    "unsupported_media_type",
];

/// The ceiling's refusals: what a session's settings may not ask for.
pub(crate) const CEILING: &[&str] = &[
    "sandbox_over_ceiling",
    "auto_approval_over_ceiling",
    "network_over_ceiling",
    "tool_over_ceiling",
    "script_model_over_ceiling",
];

/// The codes of a route that may load a session: no room, the server
/// stopping, a workspace Keel did not make, settings the ceiling no longer
/// allows (the ceiling's codes), a model the server no longer offers.
pub(crate) const LOADING: &[&str] = &[
    "too_many_sessions",
    "unavailable",
    "workspace_not_keels",
    "sandbox_over_ceiling",
    "auto_approval_over_ceiling",
    "network_over_ceiling",
    "tool_over_ceiling",
    "script_model_over_ceiling",
    "session_model_unavailable",
];

/// The codes of a route that may create a session (`create_session`): a
/// taken id or workspace name, a model or client tool the server refuses,
/// an id or tenant the credentials may not choose. Such a route also
/// answers [`CEILING`]'s and [`LOADING`]'s codes.
pub(crate) const CREATING: &[&str] = &[
    "conflict",
    "workspace_exists",
    "model_not_found",
    "missing_scope_submit",
    "tenant_forbidden",
    "invalid_client_tool",
    "client_tool_conflict",
];

/// The codes of a route that queues a submission.
pub(crate) const QUEUEING: &[&str] = &[
    "invalid_request",
    "too_large",
    "queue_full",
    "session_busy",
    "budget_exhausted",
];

/// The error responses of a route behind the token that answers `codes`
/// (besides the ones every such route can answer), one per status.
pub(crate) fn responses(codes: &[&str]) -> BTreeMap<String, RefOr<Response>> {
    open_responses(&[codes, BEHIND_THE_TOKEN].concat())
}

/// The error responses of a route anyone may call that answers `codes`
/// (besides the front door's), one per status.
pub(crate) fn open_responses(codes: &[&str]) -> BTreeMap<String, RefOr<Response>> {
    let mut by_status: BTreeMap<u16, Vec<(&str, &str)>> = BTreeMap::new();
    for &(code, status, when) in CATALOGUE {
        if codes.contains(&code) || FRONT_DOOR.contains(&code) {
            by_status.entry(status).or_default().push((code, when));
        }
    }
    by_status
        .into_iter()
        .map(|(status, codes)| (status.to_string(), RefOr::T(response(status, &codes))))
        .collect()
}

/// One status's response: the error envelope with `code` one of `codes`.
fn response(status: u16, codes: &[(&str, &str)]) -> Response {
    let description = codes
        .iter()
        .map(|(code, when)| format!("`{code}`: {when}"))
        .collect::<Vec<_>>()
        .join(" ");
    // The shared body, its `code` narrowed to this answer's codes.
    let code = ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(codes.iter().map(|(code, _)| *code)));
    let error = AllOfBuilder::new()
        .item(Ref::from_schema_name("ErrorBody"))
        .item(ObjectBuilder::new().schema_type(Type::Object).property("code", code));
    let envelope = ObjectBuilder::new()
        .schema_type(Type::Object)
        .property("error", error)
        .required("error");
    let mut builder = ResponseBuilder::new().description(description).content(
        "application/json",
        ContentBuilder::new()
            .schema(Some(Schema::Object(envelope.build())))
            .build(),
    );
    if status == 503 {
        builder = builder.header(
            "Retry-After",
            HeaderBuilder::new()
                .schema(Some(ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(0))))
                .description(Some(
                    "Seconds to wait before a retry, when the server knows (`owner_unavailable`).",
                ))
                .build(),
        );
    }
    if status == 401 {
        builder = builder.header(
            "WWW-Authenticate",
            HeaderBuilder::new()
                .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
                .description(Some("`Bearer`: the scheme the token goes in."))
                .build(),
        );
    }
    builder.build()
}

/// Declares a route's error answers as a type for `#[utoipa::path]`'s
/// `responses(...)`, from the codes it can answer: `Name: codes…` for a
/// route behind the token, `open Name: codes…` for one anyone may call.
macro_rules! route_errors {
    (@make $(#[$doc:meta])* $name:ident, $responses:ident, $($codes:expr),*) => {
        $(#[$doc])*
        pub(crate) struct $name;

        impl utoipa::IntoResponses for $name {
            fn responses() -> std::collections::BTreeMap<
                String,
                utoipa::openapi::RefOr<utoipa::openapi::response::Response>,
            > {
                let codes: Vec<&str> = [$(&$codes[..]),*].concat();
                $crate::openapi::errors::$responses(&codes)
            }
        }
    };
    ($(#[$doc:meta])* open $name:ident: $($codes:expr),* $(,)?) => {
        $crate::openapi::errors::route_errors!(@make $(#[$doc])* $name, open_responses, $($codes),*);
    };
    ($(#[$doc:meta])* $name:ident: $($codes:expr),* $(,)?) => {
        $crate::openapi::errors::route_errors!(@make $(#[$doc])* $name, responses, $($codes),*);
    };
}
pub(crate) use route_errors;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ApiError;

    #[test]
    fn every_code_of_an_error_is_catalogued_with_its_status() {
        let errors = [
            ApiError::InvalidRequest(String::new()),
            ApiError::Unauthorized,
            ApiError::CredentialRefused(String::new()),
            ApiError::ForbiddenOrigin(String::new()),
            ApiError::NotFound(String::new()),
            ApiError::ModelNotFound(String::new()),
            ApiError::InvalidForkPoint(String::new()),
            ApiError::MethodNotAllowed,
            ApiError::QueueFull,
            ApiError::SessionBusy(String::new()),
            ApiError::Conflict(String::new()),
            ApiError::ProtocolConflict {
                code: "history_mismatch",
                message: String::new(),
            },
            ApiError::ProtocolConflict {
                code: "call_not_waiting",
                message: String::new(),
            },
            ApiError::Elsewhere(String::new()),
            ApiError::KeyReused(String::new()),
            ApiError::RequestTimeout(String::new()),
            ApiError::TooLarge(String::new()),
            ApiError::UnsupportedMediaType(String::new()),
            ApiError::MisdirectedRequest(String::new()),
            ApiError::BudgetExhausted(Box::new(crate::budget::Exhausted {
                applies_to: "session",
                tenant: String::new(),
                session_id: Some(String::new()),
                limit: "total_tokens_per_day",
                allowed: 0,
                used: 0,
                resets_at_ms: Some(0),
            })),
            ApiError::TooManySessions(String::new()),
            ApiError::Unavailable(String::new()),
            ApiError::StoreUnavailable(String::new()),
            ApiError::StoreFull(String::new()),
            ApiError::OwnerUnavailable {
                message: String::new(),
                retry_after_secs: 1,
            },
            ApiError::Internal(String::new()),
        ];
        for error in errors {
            let found = CATALOGUE.iter().find(|(code, _, _)| *code == error.code());
            assert_eq!(
                found.map(|(_, status, _)| *status),
                Some(error.status().as_u16()),
                "{}",
                error.code()
            );
        }
    }

    #[test]
    fn the_docs_errors_table_lists_the_catalogue() {
        let docs = include_str!("../../../../docs/http-api.md");
        let table: std::collections::BTreeSet<(u16, &str)> = docs
            .lines()
            .filter_map(|line| {
                let mut cells = line.strip_prefix("| ")?.split(" | ");
                let status = cells.next()?.parse().ok()?;
                let code = cells.next()?.strip_prefix('`')?.strip_suffix('`')?;
                Some((status, code))
            })
            .collect();
        let catalogue: std::collections::BTreeSet<(u16, &str)> =
            CATALOGUE.iter().map(|(code, status, _)| (*status, *code)).collect();
        assert_eq!(
            table, catalogue,
            "docs/http-api.md's Errors table and the catalogue differ"
        );
    }

    #[test]
    fn a_route_answers_its_codes_and_the_common_ones_by_status() {
        let responses = responses(&["session_busy", "queue_full", "not_found"]);
        let statuses: Vec<&str> = responses.keys().map(String::as_str).collect();
        assert_eq!(
            statuses,
            ["400", "401", "403", "404", "408", "409", "413", "421", "500", "503"]
        );
        let json = serde_json::to_value(&responses["409"]).expect("serializes");
        let codes = &json["content"]["application/json"]["schema"]["properties"]["error"]["allOf"][1]["properties"]["code"]
            ["enum"];
        assert_eq!(codes, &serde_json::json!(["queue_full", "session_busy"]));
    }
}
