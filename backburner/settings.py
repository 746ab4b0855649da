"""One frozen Settings object, from ``BACKBURNER_*`` environment variables or arguments."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from .errors import ConfigurationError
from .jsoncodec import MAX_DEPTH

DEFAULT_BACKEND_URL = "sqlite:///backburner.db"
EVENT_LOOPS = ("auto", "uvloop", "asyncio")


@dataclass(frozen=True, slots=True)
class Settings:
    """Every tunable of the engine. Each field ``x`` reads ``BACKBURNER_X`` in ``from_env``."""

    backend_url: str = DEFAULT_BACKEND_URL
    max_queue_size: int | None = None
    """Most queued jobs a backend accepts; enqueue raises QueueFullError beyond. None: no bound."""
    concurrency: int = 100
    """Jobs one worker process runs at once."""
    lease_s: float = 30.0
    """How long a claim lasts without a heartbeat: the crash-detection time."""
    heartbeat_s: float = 10.0
    """How often a worker extends the leases it holds (well under lease_s)."""
    cancel_poll_s: float = 0.25
    """How often a worker looks for cancel signals for the jobs it runs."""
    sweep_interval_s: float = 1.0
    """How often each worker's sweeper re-queues expired leases and deletes expired jobs."""
    shutdown_grace_s: float = 30.0
    """On SIGTERM, how long running jobs may finish before they are handed back."""
    claim_batch: int = 256
    """Most jobs claimed in one backend call."""
    idle_wait_s: float = 1.0
    """Longest an idle worker waits before it looks at the queue again (wake-ups are pushed)."""
    default_max_attempts: int = 3
    default_timeout_s: float | None = 3600.0
    default_ttl_s: float = 86400.0
    """How long a finished job (and its events) stays readable."""
    dead_letter_ttl_s: float = 7 * 86400.0
    """How long a failed job stays in the dead-letter queue (at least its own ttl)."""
    retry_base_s: float = 1.0
    """Backoff before retry n is uniform in [0, min(retry_cap_s, retry_base_s * 2**(n-1))]."""
    retry_cap_s: float = 300.0
    host: str = "127.0.0.1"
    """Where ``backburner serve`` / ``api`` listen."""
    port: int = 8000
    max_body_bytes: int = 1024 * 1024
    """Largest request body the API reads (counted while reading, whatever Content-Length says)."""
    max_json_depth: int = 32
    """Deepest nesting of objects and arrays accepted in a request body."""
    max_prompt_chars: int = 100_000
    """Longest prompt (or all messages together) POST /v1/generate accepts."""
    max_tokens_limit: int = 4096
    """Largest max_tokens POST /v1/generate accepts."""
    max_batch_requests: int = 10_000
    """Most requests one batch (POST /v1/batches) may hold; beyond, 413 batch_too_large."""
    max_batch_bytes: int = 64 * 1024 * 1024
    """Largest body POST /v1/batches reads (its own limit: a batch is bigger than a task)."""
    research_folder: str | None = None
    """A folder of .md/.markdown/.txt/.rst files: the built-in ``research`` pipeline answers
    questions from it (docs/pipelines.md). None: no research task."""
    sse_keepalive_s: float = 15.0
    """How often an idle event stream sends a keep-alive comment."""
    models: str | None = None
    """Model routing: a TOML (or JSON) file's path, or inline JSON. None: the built-in models."""
    default_model: str | None = None
    """The model of a generation that names none (overrides the routing file's default)."""
    webhook_secret: str | None = None
    """``whsec_...`` secret(s) that sign webhooks; several, space-separated, during a rotation."""
    webhook_timeout_s: float = 15.0
    """How long one webhook attempt may take (connect to last byte)."""
    webhook_retry_schedule: str = "0,5,300,1800,7200,18000,36000,36000"
    """Seconds before each attempt of a webhook message (the first is its first attempt)."""
    webhook_allow_hosts: str = ""
    """Hosts or networks (comma-separated, e.g. ``127.0.0.0/8,localhost``) webhooks may reach
    despite the SSRF guard. Empty: only public addresses. For tests and local development."""
    webhook_concurrency: int = 100
    """Webhook messages one worker process delivers at once."""
    admin_webhook_url: str | None = None
    """Where workers POST a signed ``task.dead_lettered`` alert for each job that fails for
    good (best effort, retried on the webhook schedule while the worker runs)."""
    api_keys: str | None = None
    """API keys and their tenants, comma-separated ``TENANT:KEY`` (or ``TENANT:sha256:HEX``,
    the key's SHA-256, to keep the key itself out of the environment)."""
    admin_keys: str | None = None
    """Admin keys (DLQ, stats, every tenant's jobs), in the form of ``api_keys``."""
    keys_file: str | None = None
    """A JSON file of key hashes, written by ``backburner keys create``; re-read when it
    changes. With no key from here or the two settings above, the API is open (keyless)."""
    tenants: str | None = None
    """Per-tenant limits and weights: a TOML or JSON file's path, or inline JSON (see
    backburner/tenants.py). None: the built-in defaults."""
    pipeline_poll_s: float = 5.0
    """How often a pipeline waiting for children runs again to report their progress (the last
    child to end wakes it at once)."""
    priority_classes: str = "interactive=10,default=0,batch=-10"
    """Names a job's priority may be given by, ``name=number`` comma-separated."""
    event_loop: str = "auto"
    """The event loop of ``backburner serve``, ``api`` and ``worker``: ``uvloop``,
    ``asyncio``, or ``auto`` (uvloop where it is installed, as uvicorn does)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not _fits(str(f.type), value):
                finite = " (finite)" if str(f.type).startswith("float") else ""
                raise ConfigurationError(f"{f.name} must be {f.type}{finite}, got {value!r}")
        positive = (
            "concurrency",
            "lease_s",
            "heartbeat_s",
            "cancel_poll_s",
            "sweep_interval_s",
            "claim_batch",
            "idle_wait_s",
            "default_max_attempts",
            "default_ttl_s",
            "dead_letter_ttl_s",
            "retry_cap_s",
            "port",
            "max_body_bytes",
            "max_json_depth",
            "max_prompt_chars",
            "max_tokens_limit",
            "max_batch_requests",
            "max_batch_bytes",
            "sse_keepalive_s",
            "webhook_timeout_s",
            "webhook_concurrency",
            "pipeline_poll_s",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.retry_base_s < 0 or self.shutdown_grace_s < 0:
            raise ConfigurationError("retry_base_s and shutdown_grace_s must be >= 0")
        if self.max_json_depth > MAX_DEPTH:
            raise ConfigurationError(
                f"max_json_depth must be at most {MAX_DEPTH} (what a stored value may hold),"
                f" got {self.max_json_depth}"
            )
        if self.heartbeat_s >= self.lease_s:
            raise ConfigurationError(
                f"heartbeat_s ({self.heartbeat_s}) must be shorter than lease_s ({self.lease_s})"
            )
        if self.max_queue_size is not None and self.max_queue_size <= 0:
            raise ConfigurationError("max_queue_size must be > 0 (or unset for no bound)")
        self.retry_schedule()  # fails loudly on a bad schedule
        self.priority_class_map()
        if self.admin_webhook_url is not None and not self.admin_webhook_url.startswith(
            ("http://", "https://")
        ):
            raise ConfigurationError("admin_webhook_url must be an http:// or https:// URL")
        if self.webhook_secret is not None:
            from .webhooks.signing import check_secrets

            check_secrets(self.webhook_secret.split())
        if self.event_loop not in EVENT_LOOPS:
            raise ConfigurationError(
                f"event_loop must be one of {', '.join(EVENT_LOOPS)}, got {self.event_loop!r}"
            )
        if self.default_timeout_s is not None and self.default_timeout_s <= 0:
            raise ConfigurationError("default_timeout_s must be > 0 (or unset for none)")

    def retry_schedule(self) -> tuple[float, ...]:
        """``webhook_retry_schedule`` as numbers (ConfigurationError if it is not a list of
        seconds >= 0)."""
        try:
            delays = tuple(float(part) for part in self.webhook_retry_schedule.split(","))
        except ValueError:
            delays = ()
        if not delays or delays[0] != 0 or any(not 0 <= d < float("inf") for d in delays):
            raise ConfigurationError(
                "webhook_retry_schedule must be comma-separated seconds >= 0 starting with 0"
                f" (the first attempt goes at once), got {self.webhook_retry_schedule!r}"
            )
        return delays

    def priority_class_map(self) -> dict[str, int]:
        """``priority_classes`` as {name: priority} (ConfigurationError if malformed)."""
        classes: dict[str, int] = {}
        for part in self.priority_classes.split(","):
            name, sep, number = part.strip().partition("=")
            try:
                value = int(number)
            except ValueError:
                value = None
            if not sep or not name.strip().isidentifier() or value is None:
                raise ConfigurationError(
                    "priority_classes must be name=integer pairs, comma-separated"
                    f" (e.g. interactive=10,batch=-10), got {self.priority_classes!r}"
                )
            classes[name.strip()] = value
        return classes

    def webhook_retention_s(self) -> float:
        """How long a job with a webhook must stay for its last retry: the schedule (with
        its most jitter, 10%) and an hour to spare."""
        return sum(self.retry_schedule()) * 1.1 + 3600.0

    def allowed_webhook_hosts(self) -> tuple[str, ...]:
        return tuple(h.strip() for h in self.webhook_allow_hosts.split(",") if h.strip())

    def replace(self, **changes: Any) -> Settings:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read ``BACKBURNER_*`` variables; ``overrides`` win. Fails loudly on bad values."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(f"BACKBURNER_{f.name.upper()}")
            if raw is None:
                continue
            values[f.name] = _parse(f.name, str(f.type), raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def _fits(type_name: str, value: object) -> bool:
    if value is None:
        return "None" in type_name
    if isinstance(value, bool):
        return False
    if type_name.startswith("int"):
        return isinstance(value, int)
    if type_name.startswith("float"):
        # NaN is no setting, and infinity none either: an infinite lease or TTL would be
        # written into jobs (as text no JSON reader takes) and every later read would fail.
        try:
            return isinstance(value, int | float) and math.isfinite(value)
        except OverflowError:  # (an int past any float)
            return False
    return isinstance(value, str)


def _parse(name: str, type_name: str, raw: str) -> Any:
    text = raw.strip()
    optional = "None" in type_name
    if optional and text.lower() in ("", "none"):
        return None
    try:
        if type_name.startswith("int"):
            return int(text)
        if type_name.startswith("float"):
            return float(text)
    except ValueError:
        kind = "an integer" if type_name.startswith("int") else "a number"
        raise ConfigurationError(f"BACKBURNER_{name.upper()}={raw!r} is not {kind}") from None
    return text
