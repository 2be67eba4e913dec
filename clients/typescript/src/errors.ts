// Errors the client throws. An API error is a `KeelError` whose class is
// chosen by the machine `code` of the server's error body (docs/http-api.md,
// Errors), so callers branch on classes or codes, never on message text.

/** An error the server answered, with its HTTP status and machine code. */
export class KeelError extends Error {
  /** The HTTP status of the answer. */
  readonly status: number;
  /** The machine code of the error body (`not_found`, `session_busy`, …). */
  readonly code: string;
  /** The value of `Retry-After`, in milliseconds, when the server sent one. */
  readonly retryAfterMs: number | undefined;

  constructor(status: number, code: string, message: string, retryAfterMs?: number) {
    super(message);
    this.name = new.target.name;
    this.status = status;
    this.code = code;
    this.retryAfterMs = retryAfterMs;
  }
}

/** The request was malformed or out of bounds (`invalid_request`, `too_large`, …); retrying it fails the same way. */
export class InvalidRequestError extends KeelError {}

/** The bearer token is missing or wrong (`unauthorized`). */
export class UnauthorizedError extends KeelError {}

/** The server refuses what was asked (`forbidden_origin`, or a setting over its ceiling). */
export class ForbiddenError extends KeelError {}

/** A session setting looser than the server lets clients ask for (`*_over_ceiling`). */
export class CeilingError extends ForbiddenError {}

/** The credentials lack the scope the request needs (`missing_scope_read`, `…_submit`, `…_approve`, `…_admin`). */
export class MissingScopeError extends ForbiddenError {}

/** Credentials of one tenant naming another tenant (`tenant_forbidden`). */
export class TenantForbiddenError extends ForbiddenError {}

/** No such session or route (`not_found`). */
export class NotFoundError extends KeelError {}

/** The request conflicts with the session's state (`409`). */
export class ConflictError extends KeelError {}

/** `on_busy: reject` while a turn runs or input is queued (`session_busy`). */
export class SessionBusyError extends ConflictError {}

/** The session's submission queue is full (`queue_full`); retry later. */
export class QueueFullError extends ConflictError {}

/** An `Idempotency-Key` already used on this session for another request (`idempotency_key_reused`); nothing was queued. */
export class IdempotencyKeyReusedError extends ConflictError {}

/** A workspace directory that is not the one Keel made (`workspace_exists`, `workspace_not_keels`, `workspace_not_removable`). */
export class WorkspaceError extends ConflictError {}



/** The server cannot take the request now (`503`: `unavailable`, `store_unavailable`, `store_full`, `too_many_sessions`, `owner_unavailable`). */
export class UnavailableError extends KeelError {}

/** A token budget of the session or its tenant is spent, or the tenant runs its most turns at once (`429 budget_exhausted`); the body's `error.budget` names the limit and when it resets. */
export class BudgetExhaustedError extends KeelError {}

/** The server failed (`internal`). */
export class InternalError extends KeelError {}

type KeelErrorClass = new (status: number, code: string, message: string, retryAfterMs?: number) => KeelError;

/** The class of each documented code; codes not listed here get the base class. */
const CLASSES: Record<string, KeelErrorClass> = {
  invalid_request: InvalidRequestError,
  method_not_allowed: InvalidRequestError,
  request_timeout: InvalidRequestError,
  too_large: InvalidRequestError,
  unsupported_media_type: InvalidRequestError,
  misdirected_request: InvalidRequestError,
  invalid_client_tool: InvalidRequestError,
  client_tool_output_too_large: InvalidRequestError,
  unauthorized: UnauthorizedError,
  forbidden_origin: ForbiddenError,
  sandbox_over_ceiling: CeilingError,
  auto_approval_over_ceiling: CeilingError,
  network_over_ceiling: CeilingError,
  tool_over_ceiling: CeilingError,
  script_model_over_ceiling: CeilingError,
  missing_scope_read: MissingScopeError,
  missing_scope_submit: MissingScopeError,
  missing_scope_approve: MissingScopeError,
  missing_scope_admin: MissingScopeError,
  tenant_forbidden: TenantForbiddenError,
  webhook_url_refused: ForbiddenError,
  not_found: NotFoundError,
  model_not_found: NotFoundError,
  unknown_tool_call: NotFoundError,
  conflict: ConflictError,
  client_tool_conflict: ConflictError,
  tool_call_answered: ConflictError,
  history_mismatch: ConflictError,
  call_not_waiting: ConflictError,
  session_elsewhere: ConflictError,
  session_model_unavailable: ConflictError,
  invalid_fork_point: ConflictError,
  session_busy: SessionBusyError,
  queue_full: QueueFullError,
  webhook_limit: ConflictError,
  workspace_exists: WorkspaceError,
  workspace_not_keels: WorkspaceError,
  workspace_not_removable: WorkspaceError,
  idempotency_key_reused: IdempotencyKeyReusedError,
  unavailable: UnavailableError,
  too_many_sessions: UnavailableError,
  store_unavailable: UnavailableError,
  store_full: UnavailableError,
  owner_unavailable: UnavailableError,
  budget_exhausted: BudgetExhaustedError,
  internal: InternalError,
};

/**
 * The error for an answer with status `status` and body `body` (parsed JSON,
 * or `undefined` when it was not JSON). A body without the documented shape
 * still gives a `KeelError`, with code `unknown`.
 */
export function errorFromBody(status: number, body: unknown, retryAfterMs?: number): KeelError {
  const error = isRecord(body) && isRecord(body.error) ? body.error : undefined;
  const code = typeof error?.code === "string" ? error.code : "unknown";
  const message = typeof error?.message === "string" ? error.message : `the server answered ${status}`;
  const Class = CLASSES[code] ?? KeelError;
  return new Class(status, code, message, retryAfterMs);
}

/** The server speaks another major version of the API than this client, or did not say which it speaks. */
export class ApiVersionMismatchError extends Error {
  /** The server's `keel-api-version`, or `null` when the answer had none. */
  readonly serverVersion: string | null;
  /** The API version this client was generated for. */
  readonly clientVersion: string;

  constructor(serverVersion: string | null, clientVersion: string) {
    super(
      serverVersion === null
        ? `the server did not send a keel-api-version header; this client speaks version ${clientVersion} of the Keel API`
        : `the server speaks version ${serverVersion} of the Keel API; this client speaks ${clientVersion} (the major versions differ)`,
    );
    this.name = "ApiVersionMismatchError";
    this.serverVersion = serverVersion;
    this.clientVersion = clientVersion;
  }
}

/** The server could not be reached (refused, reset, timed out) after the retries allowed. */
export class KeelConnectionError extends Error {
  /** Whether the connection was never made (so the server got nothing, and any request may be sent again). */
  readonly beforeSending: boolean;

  constructor(message: string, options: { cause?: unknown; beforeSending?: boolean } = {}) {
    super(message, { cause: options.cause });
    this.name = "KeelConnectionError";
    this.beforeSending = options.beforeSending ?? false;
  }
}

/** A submission `waitForTurn` waited for was refused by the session (a `submission_rejected` event). */
export class SubmissionRejectedError extends Error {
  /** The submission refused. */
  readonly submissionId: string;
  /** Why, in the session's words. */
  readonly reason: string;

  constructor(submissionId: string, reason: string) {
    super(`submission ${submissionId} was rejected: ${reason}`);
    this.name = "SubmissionRejectedError";
    this.submissionId = submissionId;
    this.reason = reason;
  }
}

/** Whether `value` is a plain JSON object. */
export function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
