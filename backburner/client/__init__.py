"""The Python SDK for the backburner HTTP API: ``Client`` (blocking) and ``AsyncClient``.

>>> from backburner.client import Client
>>> with Client("http://127.0.0.1:8000") as client:  # doctest: +SKIP
...     job = client.generate("Explain leases in one line.", max_tokens=64)
...     for event in client.stream(job.task_id):
...         print(event.type, event.data)

Errors are ``backburner.errors`` classes: ``JobNotFoundError``, ``IdempotencyConflictError``,
``InvalidTransitionError``, ``InvalidInputError``, ``QueueFullError`` (each also an
``APIError`` with ``.status``, ``.type``, ``.message``), ``TransportError`` when the server
cannot be reached, ``WaitTimeoutError`` when ``wait()`` runs out of time.
"""

from ..errors import APIError, TransportError, WaitTimeoutError
from ..models import Event, JobStatus
from ._policy import RetryPolicy
from .async_client import AsyncClient
from .models import (
    Batch,
    RequestCounts,
    Stats,
    Submission,
    Task,
    TaskPage,
    Usage,
    is_terminal_event,
)
from .sse import ServerSentEvent, SSEParser
from .sync_client import Client

__all__ = [
    "APIError",
    "AsyncClient",
    "Batch",
    "Client",
    "Event",
    "JobStatus",
    "RequestCounts",
    "RetryPolicy",
    "SSEParser",
    "ServerSentEvent",
    "Stats",
    "Submission",
    "Task",
    "TaskPage",
    "TransportError",
    "Usage",
    "WaitTimeoutError",
    "is_terminal_event",
]
