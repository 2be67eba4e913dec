"""What the sync and the async clients share, free of I/O: each API call is
a generator ("flow") that yields the `Request`s to send and the `Sleep`s to
take, and is sent back each answer (or the transport error it met). The
clients only drive flows, so retries, the version check and error mapping
are written once.
"""

from __future__ import annotations

import email.utils
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, TypeVar

import httpx

from .errors import ApiVersionMismatch, ConnectionFailed, KeelError, Unavailable, error_for

API_VERSION = "1.5.0"
"""The API version this client was built for (the OpenAPI document's ``info.version``)."""

API_MAJOR = int(API_VERSION.split(".", 1)[0])

VERSION_HEADER = "keel-api-version"

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry.

    `attempts` bounds the tries of one call (the first included); the wait
    before retry ``n`` (from 0) is between half and all of
    ``min(max_delay, base_delay * 2**n)``, or the server's ``Retry-After``
    (at most `max_retry_after` seconds) when it sends one.
    """

    attempts: int = 5
    base_delay: float = 0.1
    max_delay: float = 5.0
    max_retry_after: float = 30.0

    def delay(self, retry: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number `retry` (from 0)."""
        if retry_after is not None:
            return max(0.0, min(retry_after, self.max_retry_after))
        ceiling = min(self.max_delay, self.base_delay * (2**retry))
        return ceiling / 2 + random.uniform(0, ceiling / 2)


@dataclass(frozen=True)
class Request:
    """One HTTP request of a flow.

    `resend_after_error`: whether it may be sent again after a transport
    error that could have come after the server got it (a read error): true
    for reads and for submissions carrying an ``Idempotency-Key``. A
    connection that could not be opened is retried for every request.
    """

    method: str
    path: str
    params: dict[str, Any] | None = None
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    resend_after_error: bool = False


@dataclass(frozen=True)
class Sleep:
    """A pause of a flow, in seconds."""

    seconds: float


Flow = Generator["Request | Sleep", Any, T]


def retry_after(response: httpx.Response) -> float | None:
    """The ``Retry-After`` of an answer, in seconds (a number or an HTTP date)."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return when.timestamp() - time.time()


def check_version(response: httpx.Response) -> None:
    """Raises `ApiVersionMismatch` unless the answer says it speaks our major version.

    A gateway's own error (502, 503, 504 without the header) is not the API's
    answer: it is left to the caller (retried as unavailable).
    """
    value = response.headers.get(VERSION_HEADER)
    if value is None:
        if response.status_code in (502, 503, 504):
            return
        raise ApiVersionMismatch(
            f"the server's answer has no `{VERSION_HEADER}` header: it is not a Keel server speaking API "
            f"{API_MAJOR}.x (this client is built for {API_VERSION})",
            status=response.status_code,
            code="api_version_mismatch",
        )
    major = value.split(".", 1)[0].strip()
    if major != str(API_MAJOR):
        raise ApiVersionMismatch(
            f"the server speaks API {value}; this client is built for {API_VERSION} (major {API_MAJOR}): "
            f"use a keel-client of major version {major}",
            status=response.status_code,
            code="api_version_mismatch",
        )


def error_of(response: httpx.Response) -> KeelError:
    """The typed error of a non-success answer (its body read)."""
    try:
        body = response.json()
        error = body["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        code = f"http_{response.status_code}"
        message = response.text[:200] or response.reason_phrase
        if response.status_code in (502, 503, 504):
            return Unavailable(message, status=response.status_code, code=code)
    return error_for(response.status_code, code, message)


def retryable_status(status: int) -> bool:
    """Whether an answer means nothing was done and a retry may work."""
    return status in (502, 503, 504)


def may_resend(error: Exception, request: Request) -> bool:
    """Whether a transport error allows sending `request` again."""
    if isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)):
        return True
    return request.resend_after_error and isinstance(error, httpx.TransportError)


def connection_failed(error: Exception, request: Request) -> ConnectionFailed:
    """The error a call raises when its transport errors outlast its retries."""
    return ConnectionFailed(
        f"{request.method} {request.path}: {type(error).__name__}: {error}", code="connection_failed"
    )


def exchange(request: Request, policy: RetryPolicy) -> Flow[httpx.Response]:
    """Sends `request` until it is answered with success, retrying what may be.

    The same request (with the same ``Idempotency-Key``) is sent on every
    try. Raises the typed error of a failure answer, `ConnectionFailed` when
    no answer came.
    """
    retry = 0
    while True:
        outcome = yield request
        last_try = retry + 1 >= policy.attempts
        if isinstance(outcome, Exception):
            if last_try or not may_resend(outcome, request):
                raise connection_failed(outcome, request) from outcome
            yield Sleep(policy.delay(retry))
            retry += 1
            continue
        check_version(outcome)
        if outcome.is_success:
            return outcome
        if retryable_status(outcome.status_code) and not last_try:
            yield Sleep(policy.delay(retry, retry_after(outcome)))
            retry += 1
            continue
        raise error_of(outcome)


def call(request: Request, policy: RetryPolicy, parse: Callable[[Any], T]) -> Flow[T]:
    """`exchange`, then `parse` of the JSON body."""
    response = yield from exchange(request, policy)
    return parse(response.json())


def no_body(request: Request, policy: RetryPolicy) -> Flow[None]:
    """`exchange` of a request answered without a body."""
    yield from exchange(request, policy)
    return None
