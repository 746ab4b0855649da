"""Every exception backburner raises on purpose.

The tree::

    BackburnerError                 base of everything below
    ├── ConfigurationError          a bad setting or backend URL
    │   └── MissingDependencyError  an optional extra is not installed
    ├── BackendError                the storage failed (corrupt file, unwritable path, lost server)
    │   ├── BackendConnectionError  the connection broke mid-command: did it take effect? unknown
    │   └── CorruptRecordError      a stored job no reader can read back (damaged, or foreign)
    ├── InvalidInputError           a bad argument to enqueue: input, priority, ttl, ...
    │   ├── UnknownTaskError        no task registered under that name
    │   └── UnsafeURLError          a webhook URL that reaches a private or internal address
    ├── JobNotFoundError            no such job (never existed, or deleted by its TTL)
    ├── IdempotencyConflictError    same idempotency key, different input
    ├── QueueFullError              the backend's queue-size bound is reached
    ├── LimitExceededError          a tenant's limit refused a submission (.retry_after)
    │   ├── QuotaExceededError      its jobs in flight (queued + processing) are at its quota
    │   └── SubmitRateLimitedError  it submitted faster than its per-minute rate
    ├── AuthError                   no API key, or one the API does not know (401)
    │   ├── MalformedAuthError      the Authorization header is not "Bearer <key>" (400)
    │   └── PermissionDeniedError   the key may not do that: an admin-only route (403)
    ├── InvalidTransitionError      the job's state does not allow that (delete a running job)
    ├── LeaseLostError              a worker wrote with a stale attempt (fencing)
    ├── APIError                    the HTTP API answered an error (client; .status .type .message)
    ├── TransportError              the client could not reach the API, even after retries
    ├── WaitTimeoutError            the client's wait() ran out of time (also a TimeoutError)
    ├── WebhookVerificationError    a received webhook did not verify (header, time, signature)
    └── TaskError                   raised by handlers to steer the retry policy
        ├── Retry                   retry this attempt, optionally after a delay
        ├── Suspend                 park the job, attempt not charged, until woken or a time
        │   └── WaitForChildren     park a pipeline until its children end (or a poll)
        ├── PermanentError          fail the job at once, no retry
        │   ├── PipelineDefinitionError  a step name repeated, or steps in another order
        │   ├── ChildFailedError         a pipeline's child failed for good (names it)
        │   └── InvalidResultError       a step's result cannot be stored (invalid_result)
        └── ProviderError           a model provider failed (``code`` names how, on the job)
            ├── RateLimitedError            429, or 503 with Retry-After   (a Retry)
            ├── ProviderUnavailableError    5xx, connection, timeout        (a Retry)
            ├── StreamInterruptedError      the stream stopped before its end (a Retry)
            ├── ContextLengthExceededError  the prompt does not fit     (a PermanentError)
            ├── ProviderRequestError        400: the provider refused the request (permanent)
            ├── ProviderAuthError           401/403: key missing or refused   (permanent)
            ├── QuotaExhaustedError         429 insufficient_quota: billing, not load (permanent)
            └── ModelNotFoundError          404, or no route for the model    (permanent)

Handlers may raise any exception; only ``TaskError`` subclasses carry instructions.

The HTTP client (``backburner.client``) raises the library class that matches the error type
on the wire (``JobNotFoundError`` for 404, ``IdempotencyConflictError``, ``InvalidTransitionError``,
``InvalidInputError`` / ``UnknownTaskError``, ``QueueFullError``, ``BackendError`` for 503,
``CorruptRecordError`` for 500 ``corrupt_record``); each
of those is then also an ``APIError``, so ``except APIError`` catches every error answer.
"""

from __future__ import annotations

from typing import ClassVar


class BackburnerError(Exception):
    """Base class of every backburner exception."""


class ConfigurationError(BackburnerError):
    """A setting, environment variable or backend URL is invalid."""


class MissingDependencyError(ConfigurationError):
    """An optional dependency is missing; the message names the extra to install."""


class BackendError(BackburnerError):
    """The backend could not be opened, read or written."""


class CorruptRecordError(BackendError):
    """A stored job could not be read back: its record was damaged (by hand, by a disk) or was
    written by software that stores what this release cannot read.

    A worker that meets one fails it (error type ``corrupt_record``) instead of running it, and
    goes on; a listing leaves it out; reading it alone raises this. ``task_id``: the job's id,
    or None if even that could not be read."""

    def __init__(self, task_id: str | None, reason: str) -> None:
        self.task_id = task_id
        self.reason = reason
        job = "a job" if task_id is None else f"job {task_id}"
        super().__init__(f"{job}: its stored record cannot be read ({reason})")


class BackendConnectionError(BackendError):
    """The connection to the backend broke during a command: whether it took effect is unknown.

    Repeating a read is safe; a write must be checked or be harmless to repeat."""


class NotPrimaryError(BackendConnectionError):
    """The Redis answered as a replica (``READONLY``): a failover made another one the primary.
    Nothing was written; the connection is dropped and the next one goes to the new primary."""


class NotReplicatedError(BackendConnectionError):
    """The write took effect on the Redis primary, but fewer replicas than the backend URL asks
    for (``?replicas=N``) confirmed it in time: a failover now could lose it. Repeat it with
    the same idempotency key to be sure."""


class InvalidInputError(BackburnerError):
    """An argument of enqueue (or a similar call) is invalid. Nothing was stored."""


class UnknownTaskError(InvalidInputError):
    """No task is registered under the given name."""


class JobNotFoundError(BackburnerError):
    """The job does not exist (or expired past its TTL)."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"no job with id {task_id!r}")
        self.task_id = task_id


class IdempotencyConflictError(BackburnerError):
    """The idempotency key is already used by a job with different input, or by a job of
    another tenant (``task_id`` then ``""``: another tenant's job is never named)."""

    def __init__(self, key: str, task_id: str) -> None:
        if task_id:
            message = (
                f"idempotency key {key!r} is already used by job {task_id} with different input"
            )
        else:
            message = f"idempotency key {key!r} is already used by another job"
        super().__init__(message)
        self.key = key
        self.task_id = task_id


class QueueFullError(BackburnerError):
    """The backend holds as many queued jobs as its max_queue_size allows."""


class LimitExceededError(BackburnerError):
    """A tenant's limit refused a submission; nothing was stored. ``retry_after`` is how many
    seconds until trying again may succeed (None: unknown)."""

    def __init__(self, message: str, *, tenant: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.tenant = tenant
        self.retry_after = retry_after


class QuotaExceededError(LimitExceededError):
    """The tenant has as many jobs queued or processing as its ``max_in_flight`` allows."""

    def __init__(self, tenant: str, limit: int, *, retry_after: float | None = None) -> None:
        super().__init__(
            f"tenant {tenant!r} has {limit} jobs in flight, its limit (max_in_flight);"
            " wait for one to finish",
            tenant=tenant,
            retry_after=retry_after,
        )
        self.limit = limit


class SubmitRateLimitedError(LimitExceededError):
    """The tenant submitted more jobs than its ``submissions_per_minute`` allows."""

    def __init__(self, tenant: str, per_minute: int, *, retry_after: float) -> None:
        super().__init__(
            f"tenant {tenant!r} may submit {per_minute} jobs a minute;"
            f" try again in {retry_after:.3g} s",
            tenant=tenant,
            retry_after=retry_after,
        )
        self.per_minute = per_minute


class AuthError(BackburnerError):
    """The API refused the caller: no key, or a key it does not know (it never says which)."""


class MalformedAuthError(AuthError):
    """The Authorization header is there but is not ``Bearer <key>``."""


class PermissionDeniedError(AuthError):
    """The caller's key is valid but may not do this (an admin-only route)."""


class InvalidTransitionError(BackburnerError):
    """The job's current status does not allow the requested change."""


class LeaseLostError(BackburnerError):
    """The writer no longer holds the job's lease for this attempt (it was fenced off)."""

    def __init__(self, task_id: str, fence: int) -> None:
        super().__init__(f"lease on job {task_id} (claim {fence}) is no longer held")
        self.task_id = task_id
        self.fence = fence


class APIError(BackburnerError):
    """The HTTP API answered with an error: ``status``, ``type`` and the server's ``message``."""

    def __init__(
        self, message: str, *, status: int, type: str, retry_after: float | None = None
    ) -> None:
        # Not super(): the client's subclasses also derive from classes whose __init__ takes
        # other arguments (JobNotFoundError(task_id)); the message must stay the server's.
        BackburnerError.__init__(self, message)
        self.message = message
        self.status = status
        self.type = type
        self.retry_after = retry_after
        """Seconds the server asked the client to wait (its Retry-After header), if any."""

    def __str__(self) -> str:
        return self.message


class TransportError(BackburnerError):
    """The client could not reach the API (connect, read or protocol failure) after retries."""


class WaitTimeoutError(BackburnerError, TimeoutError):
    """A job did not reach a terminal status within the client's wait timeout."""

    def __init__(self, task_id: str, timeout: float, status: str | None = None) -> None:
        super().__init__(
            f"job {task_id} is still {status or 'unfinished'} after waiting {timeout:g} s"
        )
        self.task_id = task_id
        self.timeout = timeout
        self.status = status


class TaskError(BackburnerError):
    """Base of the exceptions a handler raises to steer the retry policy."""


class Retry(TaskError):  # noqa: N818 - a verb reads better at the raise site
    """Retry the job; wait ``after`` seconds first if given (e.g. from Retry-After)."""

    def __init__(self, message: str = "retry requested", *, after: float | None = None) -> None:
        if after is not None and not (0 <= after < float("inf")):  # also refuses NaN
            raise ValueError(f"Retry(after=...) must be a finite number >= 0, got {after!r}")
        super().__init__(message)
        self.after = after


class PermanentError(TaskError):
    """Fail the job now: retrying cannot help (bad input, context too long, ...)."""


class Suspend(TaskError):  # noqa: N818 - a verb reads better at the raise site
    """Park the job without charging an attempt: it runs again after ``after`` seconds, or as
    soon as it is woken (a pipeline raises it while its children run)."""

    def __init__(self, reason: str = "waiting", *, after: float) -> None:
        if not (0 <= after < float("inf")):
            raise ValueError(f"Suspend(after=...) must be a finite number >= 0, got {after!r}")
        super().__init__(reason)
        self.reason = reason
        self.after = after


class WaitForChildren(Suspend):
    """Park a pipeline while its children run: as ``Suspend``, and woken as soon as none is
    open, or one fails (a plain ``Suspend`` waits out its ``after``: nothing else wakes it)."""


class PipelineDefinitionError(PermanentError):
    """A pipeline's code broke a rule of durable steps: a step name used twice in a run, or
    steps called in another order than in an earlier run of the same job."""


class ChildFailedError(PermanentError):
    """A pipeline's child job failed for good (or was cancelled, or expired)."""

    def __init__(self, message: str, *, child_id: str, step: str) -> None:
        super().__init__(message)
        self.child_id = child_id
        self.step = step


class InvalidResultError(PermanentError):
    """A pipeline step's result cannot be stored (not JSON, a lone UTF-16 surrogate, nested too
    deep): the job fails at once with error type ``invalid_result``, as when a handler returns
    such a result. Running the step again would return the same."""


class ProviderError(TaskError):
    """A model provider failed; ``code`` is the error type the job records.

    ``status`` is the provider's HTTP status (None when no answer came); ``after`` is the
    wait it asked for (Retry-After), if any.
    """

    code: ClassVar[str] = "provider_error"
    retryable: ClassVar[bool] = False

    def __init__(
        self, message: str, *, status: int | None = None, after: float | None = None
    ) -> None:
        if after is not None and not (0 <= after < float("inf")):
            raise ValueError(f"after must be a finite number >= 0, got {after!r}")
        super().__init__(message)
        self.status = status
        self.after = after


class RateLimitedError(ProviderError, Retry):
    """429 (or 503 with Retry-After): retry, after the wait the provider asked for."""

    code = "rate_limited"
    retryable = True


class ProviderUnavailableError(ProviderError, Retry):
    """A 5xx, a refused or dropped connection, or a timeout: retry with backoff."""

    code = "provider_unavailable"
    retryable = True


class StreamInterruptedError(ProviderError, Retry):
    """The token stream stopped before its end; the text so far is in the job's events."""

    code = "stream_interrupted"
    retryable = True


class ContextLengthExceededError(ProviderError, PermanentError):
    """The prompt plus max_tokens do not fit the model's context window."""

    code = "context_length_exceeded"


class ProviderRequestError(ProviderError, PermanentError):
    """The provider refused the request as invalid (400, 422)."""

    code = "invalid_request"


class ProviderAuthError(ProviderError, PermanentError):
    """The provider refused the credentials (401, 403), or the key's variable is unset."""

    code = "authentication_failed"


class QuotaExhaustedError(ProviderError, PermanentError):
    """The account's quota or spending limit is used up (OpenAI's 429 ``insufficient_quota``):
    waiting does not bring it back, so the job fails at once, or goes to its fallback."""

    code = "quota_exhausted"


class ModelNotFoundError(ProviderError, PermanentError):
    """The provider has no such model (404), or no route names it."""

    code = "model_not_found"


class WebhookVerificationError(BackburnerError):
    """A received webhook is not authentic: a header is missing or malformed, its timestamp
    is outside the tolerance, or no signature matches. The message names the failed check."""


class UnsafeURLError(InvalidInputError):
    """A webhook URL is refused: bad scheme, credentials, or a private/internal target (SSRF)."""
