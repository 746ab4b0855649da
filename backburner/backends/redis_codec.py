"""How jobs and events are laid out in Redis, and read back.

A job is two keys. ``s:<id>`` holds what never changes as JSON object members (input, metadata,
...). ``j:<id>`` is a hash of what does: each field named like a ``Job`` field holds JSON text
(Lua writes numbers exactly and copies JSON it was given), and fields starting with ``_`` are
the backend's own bookkeeping. ``webhook_url``, ``webhook_progress``, ``tenant`` and
``parent_id`` never change but are hash fields all the same: the scripts that write webhook
messages read the first two (the terminal transition, ``add_progress_webhook``; a job without
them reads as None and false), the ones that count a tenant's jobs in flight and put its jobs
in its fair-share line read ``tenant`` (with ``_fc``, the job's fair cost, and ``_tg``, its
fair-share tag, kept until it is terminal so that a Release puts it back in its place), and
the ones that count a parent's open children, and delete and purge, which drop a child from
its parent's index, read ``parent_id`` (absent: no parent, None). Jobs
enqueued by the previous release keep ``webhook_url`` only in the spec; the terminal
transitions fall back to it there (``spec_webhook_url`` in ``redis_lua/prelude.lua``). The
script that reads a job joins both keys into one JSON document (``read_job`` in
``redis_lua/prelude.lua``), which pydantic-core parses in one call: the worker process, the
busier side, only parses.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import CorruptRecordError
from ..jsoncodec import encode
from ..models import Event, Job, WebhookDelivery, stored_job
from .base import NewJob, NextClaim


def priority_code(priority: int) -> str:
    """The first part of a ready-queue member, which sorts as text: 3 digits, highest priority
    first. The rest (fair-share tag, seq, run code, id) is made by the scripts
    (``enqueue_ready`` in redis_lua/prelude.lua)."""
    code = _PRIORITY_CODES.get(priority)
    return f"{100 - priority:03d}" if code is None else code


_PRIORITY_CODES = {priority: f"{100 - priority:03d}" for priority in range(-100, 101)}
"""Every valid priority's code, made once: formatting one was 2.5% of a producer's CPU."""


def number(value: float) -> str:
    """JSON text for a float that reads back as exactly the same float."""
    return repr(float(value))


def _member(name: str, value: str) -> str:
    return f'"{name}":{value}'


def new_job_spec(
    job: NewJob, input_json: str, metadata_json: str, created_at: str, ttl_s: str
) -> str:
    """The immutable members of a job, as JSON object members without braces (``created_at``
    and ``ttl_s`` as ``number`` makes them)."""
    parts = [
        _member("task_id", encode(job.task_id)),
        _member("type", encode(job.type)),
        _member("input", input_json),
        _member("created_at", created_at),
        _member("metadata", metadata_json),
        _member("ttl_s", ttl_s),
    ]
    if job.timeout_s is not None:
        parts.append(_member("timeout_s", number(job.timeout_s)))
    if job.idempotency_key is not None:
        parts.append(_member("idempotency_key", encode(job.idempotency_key)))
    if job.traceparent is not None:
        parts.append(_member("traceparent", encode(job.traceparent)))
    return ",".join(parts)


def new_job_fields(job: NewJob, run_at: str, ttl_s: str) -> list[str]:
    """The mutable hash fields of a new queued job, as field, value pairs, but for those
    enqueue.lua writes from its other arguments or as constants (status, priority, attempts,
    fence, _ty, _pq, tenant, _fc, and _fp, the fingerprint, which only a job with an
    idempotency key has): a producer sending many jobs at once spends a tenth of its time
    packing arguments. ``run_at`` and ``ttl_s`` as ``number`` makes them."""
    fields = ["run_at", run_at, "max_attempts", str(job.max_attempts), "_ttl", ttl_s]
    if job.deadline_at is not None:
        fields += ["deadline_at", number(job.deadline_at), "_dl"]
        fields.append(number(job.deadline_at - job.created_at))
    if job.idempotency_key is not None:
        fields += ["_ik", job.idempotency_key]
    if job.webhook_url is not None:  # in the hash: the terminal transition reads it
        fields += ["webhook_url", encode(job.webhook_url)]
    if job.webhook_progress:  # in the hash: add_progress_webhook reads it (absent: false)
        fields += ["webhook_progress", "true"]
    if job.parent_id is not None:  # in the hash: the scripts that count open children read it
        fields += ["parent_id", encode(job.parent_id)]
    return fields


def decode_job(document: bytes) -> Job:
    """A Job from the JSON document a script builds (``read_job`` in redis_lua/prelude.lua)."""
    return stored_job(document)


def decode_webhooks(documents: list[Any]) -> list[WebhookDelivery]:
    """Webhook messages from a script's JSON documents (``read_webhook`` in
    redis_lua/prelude.lua: the message hash's fields hold JSON text, like a job's; one
    written before ``claim`` and ``tries`` existed lacks them, and reads them as 0)."""
    return [WebhookDelivery.model_validate_json(document) for document in documents if document]


def decode_events(task_id: str, entries: list[Any]) -> list[Event]:
    """Events from XRANGE entries: [id, [field, value, ...]] with id "<seq>-0"."""
    events = []
    for entry_id, flat in entries:
        try:
            fields = dict(zip(flat[::2], flat[1::2], strict=True))
            event = Event.model_construct(
                task_id=task_id,
                seq=int(entry_id.split(b"-", 1)[0]),
                type=fields[b"t"].decode(),
                data=json.loads(fields[b"d"]),
                at=float(fields[b"a"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # (a damaged entry)
            where = entry_id.decode(errors="replace") if isinstance(entry_id, bytes) else entry_id
            raise CorruptRecordError(task_id, f"event {where}: {exc!s:.80}") from None
        events.append(event)
    return events


_NEXT_CLAIM = '{{"w":{},"j":{},"s":{},"t":{},"n":{}}}'


class NextClaimTexts:
    """finish.lua's next-claim argument (the claim's worker, lease length, types and limit),
    made once per distinct claim: a worker asks the same claim of every finish, and the same
    text lets a batch of finishes decode it once (finish_many.lua). A process asks a few; the
    cache is emptied should it ever hold many."""

    def __init__(self) -> None:
        self._texts: dict[tuple[str, float, tuple[str, ...] | None, int], str] = {}

    def text(self, claim: NextClaim) -> str:
        types = None if claim.types is None else tuple(claim.types)
        key = (claim.worker_id, claim.lease_s, types, claim.limit)
        text = self._texts.get(key)
        if text is None:
            if len(self._texts) >= 64:
                self._texts.clear()
            text = self._texts[key] = _NEXT_CLAIM.format(
                json.dumps(claim.worker_id),
                json.dumps(encode(claim.worker_id)),
                number(claim.lease_s),
                json.dumps(None if types is None else list(types)),
                int(claim.limit),
            )
        return text
