"""Typed errors: one class per family of the API's error codes
(docs/http-api.md, Errors), all under `KeelError`.

An error the server answers becomes the class of its ``code``; a code this
client does not know becomes a plain `KeelError`, with the code kept.
"""

from __future__ import annotations


class KeelError(Exception):
    """An error of the API or of this client.

    `status` is the HTTP status (``None`` when no answer came), `code` the
    machine code (``error.code`` of the body), `message` the human message.
    """

    def __init__(self, message: str, *, status: int | None = None, code: str = "unknown") -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def __str__(self) -> str:
        status = f"{self.status} " if self.status is not None else ""
        return f"{status}{self.code}: {self.message}"


class InvalidRequest(KeelError):
    """400 ``invalid_request``: malformed JSON, unknown fields, bad values."""


class Unauthorized(KeelError):
    """401 ``unauthorized``: a missing or wrong bearer token."""


class Forbidden(KeelError):
    """403: refused by the server's policy (the subclasses say which)."""


class OverCeiling(Forbidden):
    """403 ``*_over_ceiling``: a setting beyond what the operator lets clients ask for."""


class ForbiddenOrigin(Forbidden):
    """403 ``forbidden_origin``: a browser request from another origin."""


class MissingScope(Forbidden):
    """403 ``missing_scope_*``: the credentials lack the scope the request needs."""


class TenantForbidden(Forbidden):
    """403 ``tenant_forbidden``: credentials of one tenant naming another, or
    choosing a new session's id."""


class WebhookUrlRefused(Forbidden):
    """403 ``webhook_url_refused``: a webhook endpoint's URL the server's
    ``[webhooks]`` settings refuse (not https, credentials, a private address)."""


class BudgetExhausted(KeelError):
    """429 ``budget_exhausted``: a token budget of the session or its tenant is
    spent, or the tenant runs as many turns as it may at once; the error's
    ``budget`` names the limit and when it resets."""


class NotFound(KeelError):
    """404 ``not_found``: an unknown session or route."""


class ModelNotFound(NotFound):
    """404 ``model_not_found``: the session's model is one the server cannot build."""


class MethodNotAllowed(KeelError):
    """405 ``method_not_allowed``."""


class RequestTimeout(KeelError):
    """408 ``request_timeout``: the body did not arrive in time."""


class Conflict(KeelError):
    """409 ``conflict``: a session with that id exists."""


class InvalidForkPoint(KeelError):
    """409 ``invalid_fork_point``: a fork point inside a turn, past the log, or in a write batch."""


class SessionBusy(KeelError):
    """409 ``session_busy``: ``on_busy: reject`` while a turn runs."""


class SessionModelUnavailable(KeelError):
    """409 ``session_model_unavailable``: a stored session whose model the server no longer offers;
    ``PATCH`` its ``model`` (see ``GET /v1/models``) to load it again."""


class QueueFull(KeelError):
    """409 ``queue_full``: the session's submission queue is full; retry later."""


class WebhookLimit(KeelError):
    """409 ``webhook_limit``: the server keeps as many webhook endpoints as it may."""


class WorkspaceConflict(KeelError):
    """409 ``workspace_*``: the session's workspace is not one Keel made for it."""


class SessionElsewhere(KeelError):
    """409 ``session_elsewhere``: the session runs on another node."""


class TooLarge(KeelError):
    """413 ``too_large``: the body or the message is over its limit."""


class UnsupportedMediaType(KeelError):
    """415 ``unsupported_media_type``."""


class MisdirectedRequest(KeelError):
    """421 ``misdirected_request``: a ``Host`` the server does not answer for."""


class IdempotencyKeyReused(KeelError):
    """``idempotency_key_reused`` (409): the key was used for another request; nothing was queued."""


class InternalError(KeelError):
    """500 ``internal``: a server fault; the message says what."""


class Unavailable(KeelError):
    """503: nothing was done; retry later (the subclasses say why)."""


class TooManySessions(Unavailable):
    """503 ``too_many_sessions``: no live session can be unloaded to make room."""


class StoreUnavailable(Unavailable):
    """503 ``store_unavailable``: the database cannot be reached."""


class StoreFull(Unavailable):
    """503 ``store_full``: the disk or the database's size cap is full."""


class OwnerUnavailable(Unavailable):
    """503 ``owner_unavailable``: several nodes, and the one running the session
    did not take the submission up in time. It may still run: retry with the
    same idempotency key (``submit`` does) to learn its real answer."""


class ConnectionFailed(KeelError):
    """No answer came (connection refused, reset, timed out) after every retry."""


class ApiVersionMismatch(KeelError):
    """The server speaks another major version of the API, or did not say which."""


class SubmissionRejected(KeelError):
    """A submission was accepted, then recorded as ``submission_rejected``."""


_BY_CODE: dict[str, type[KeelError]] = {
    "invalid_request": InvalidRequest,
    "unauthorized": Unauthorized,
    "sandbox_over_ceiling": OverCeiling,
    "auto_approval_over_ceiling": OverCeiling,
    "network_over_ceiling": OverCeiling,
    "tool_over_ceiling": OverCeiling,
    "script_model_over_ceiling": OverCeiling,
    "forbidden_origin": ForbiddenOrigin,
    "missing_scope_read": MissingScope,
    "missing_scope_submit": MissingScope,
    "missing_scope_approve": MissingScope,
    "missing_scope_admin": MissingScope,
    "tenant_forbidden": TenantForbidden,
    "webhook_url_refused": WebhookUrlRefused,
    "budget_exhausted": BudgetExhausted,
    "not_found": NotFound,
    "model_not_found": ModelNotFound,
    "method_not_allowed": MethodNotAllowed,
    "request_timeout": RequestTimeout,
    "conflict": Conflict,
    "history_mismatch": Conflict,
    "call_not_waiting": Conflict,
    "invalid_client_tool": InvalidRequest,
    "client_tool_conflict": Conflict,
    "unknown_tool_call": NotFound,
    "tool_call_answered": Conflict,
    "client_tool_output_too_large": TooLarge,
    "invalid_fork_point": InvalidForkPoint,
    "session_busy": SessionBusy,
    "queue_full": QueueFull,
    "webhook_limit": WebhookLimit,
    "workspace_exists": WorkspaceConflict,
    "workspace_not_keels": WorkspaceConflict,
    "workspace_not_removable": WorkspaceConflict,
    "session_elsewhere": SessionElsewhere,
    "session_model_unavailable": SessionModelUnavailable,
    "too_large": TooLarge,
    "unsupported_media_type": UnsupportedMediaType,
    "misdirected_request": MisdirectedRequest,
    "idempotency_key_reused": IdempotencyKeyReused,
    "internal": InternalError,
    "unavailable": Unavailable,
    "too_many_sessions": TooManySessions,
    "store_unavailable": StoreUnavailable,
    "store_full": StoreFull,
    "owner_unavailable": OwnerUnavailable,
}


def error_for(status: int, code: str, message: str) -> KeelError:
    """The typed error of an API error answer."""
    cls = _BY_CODE.get(code, KeelError)
    return cls(message, status=status, code=code)


def known_codes() -> set[str]:
    """Every error code that has a class of its own."""
    return set(_BY_CODE)
