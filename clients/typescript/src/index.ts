// @keel/client: a typed client for Keel's HTTP API (docs/http-api.md).

export { Keel, Sessions, type SubmitOptions, type TurnResult, type WaitOptions } from "./client.js";
export {
  ApiVersionMismatchError,
  BudgetExhaustedError,
  CeilingError,
  ConflictError,
  ForbiddenError,
  IdempotencyKeyReusedError,
  InternalError,
  InvalidRequestError,
  KeelConnectionError,
  KeelError,
  MissingScopeError,
  NotFoundError,
  QueueFullError,
  SessionBusyError,
  SubmissionRejectedError,
  TenantForbiddenError,
  UnauthorizedError,
  UnavailableError,
  WorkspaceError,
  errorFromBody,
} from "./errors.js";
export type { components, paths } from "./generated/openapi.js";
export { API_VERSION } from "./generated/version.js";
export { DEFAULT_RECONNECT, DEFAULT_RETRY, type RetryPolicy, backoffDelay, parseRetryAfter } from "./retry.js";
export { type SseMessage, SseParser } from "./sse.js";
export { EventStream, type StreamOptions } from "./stream.js";
export { type KeelOptions, VERSION_HEADER } from "./transport.js";
export * from "./types.js";
