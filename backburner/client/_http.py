"""The wire format, shared by both clients: what each call sends and how its answer is read.

Nothing here does I/O. A method of a client builds a ``Call`` here, sends it (with retries)
its own sync or async way, and hands the response back here to be checked and parsed.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from .. import __version__
from ..errors import ConfigurationError, InvalidInputError, TransportError
from ..models import Event, JobStatus
from ._errors import invalid_response, raise_for_error
from .models import Submission
from .sse import ServerSentEvent

M = TypeVar("M", bound=BaseModel)

USER_AGENT = f"backburner-client/{__version__}"


@dataclass(slots=True)
class Call:
    """One API request, and whether repeating it is safe."""

    method: str
    path: str
    params: dict[str, str | int] = field(default_factory=dict)
    json: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    idempotent: bool = True
    task_id: str | None = None  # for JobNotFoundError.task_id
    key: str | None = None  # the Idempotency-Key sent
    key_generated: bool = False  # ... made up by the client, so only its own repeats match
    sent: int = 0  # how many times it went out (more than once: it was retried)
    timeout: httpx.Timeout | None = None  # (None: the client's)
    stream: bool = False  # the body is read as it comes (the caller closes the response)

    def build(self, http: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        return http.build_request(
            self.method,
            self.path,
            params=self.params,
            json=self.json,
            headers=self.headers,
            timeout=self.timeout if self.timeout is not None else httpx.USE_CLIENT_DEFAULT,
        )


def base_url(url: str | httpx.URL) -> httpx.URL:
    """``url`` as the client's base; ConfigurationError (one line) if it is malformed."""
    try:
        return httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise ConfigurationError(f"invalid server URL {str(url)!r}: {exc}") from None


def default_headers(api_key: str | None) -> dict[str, str]:
    """The headers of every request: ``api_key`` (None: BACKBURNER_API_KEY) as a Bearer token."""
    headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
    if api_key is None:
        api_key = os.environ.get("BACKBURNER_API_KEY") or None
    if api_key:
        key = api_key.strip()  # (a key read from a file keeps its newline)
        if not key or not all("!" <= ch <= "~" for ch in key):
            raise ConfigurationError(
                "the API key must be printable ASCII without spaces (bb_...): check"
                " BACKBURNER_API_KEY or api_key (it is not shown here)"
            )
        headers["Authorization"] = f"Bearer {key}"
    return headers


def task_path(task_id: str, suffix: str = "") -> str:
    if not isinstance(task_id, str) or not task_id:
        raise InvalidInputError(f"task_id must be a non-empty string, got {task_id!r}")
    return f"/v1/tasks/{quote(task_id, safe='')}{suffix}"


def _options(**values: Any) -> dict[str, Any]:
    return {name: value for name, value in values.items() if value is not None}


def _keyed(path: str, body: dict[str, Any], key: str | None) -> Call:
    """A submission: its body checked here, as the API would (an InvalidInputError, not a
    TypeError from deep in httpx, nor NaN sent as JSON it is not), under ``key``."""
    try:
        json.dumps(body, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInputError(f"the request cannot be sent as JSON: {exc}") from None
    generated = key is None
    if key is None:
        key = uuid.uuid4().hex
    elif not (
        isinstance(key, str) and 1 <= len(key) <= 255 and key.isascii() and key.isprintable()
    ):
        raise InvalidInputError("idempotency_key must be 1 to 255 printable ASCII characters")
    return Call(
        "POST", path, json=body, headers={"Idempotency-Key": key}, key=key, key_generated=generated
    )


def submit_call(
    type: str,
    input: Mapping[str, Any] | None,
    *,
    priority: int | str | None,
    webhook_url: str | None,
    webhook_progress: bool,
    metadata: Mapping[str, Any] | None,
    max_attempts: int | None,
    timeout_s: float | None,
    ttl_s: float | None,
    delay_s: float | None,
    idempotency_key: str | None,
) -> Call:
    body = _options(
        type=type,
        input=dict(input) if input is not None else None,
        priority=priority,
        webhook_url=webhook_url,
        webhook_progress=webhook_progress or None,
        metadata=dict(metadata) if metadata is not None else None,
        max_attempts=max_attempts,
        timeout_s=timeout_s,
        ttl_s=ttl_s,
        delay_s=delay_s,
    )
    return _keyed("/v1/tasks", body, idempotency_key)


def generate_call(
    prompt: str | None,
    *,
    messages: Sequence[Mapping[str, str]] | None,
    model: str | None,
    max_tokens: int,
    temperature: float | None,
    priority: int | str | None,
    webhook_url: str | None,
    webhook_progress: bool,
    metadata: Mapping[str, Any] | None,
    idempotency_key: str | None,
) -> Call:
    body = _options(
        prompt=prompt,
        messages=[dict(m) for m in messages] if messages is not None else None,
        model=model,
        max_tokens=max_tokens,
        temperature=temperature,
        priority=priority,
        webhook_url=webhook_url,
        webhook_progress=webhook_progress or None,
        metadata=dict(metadata) if metadata is not None else None,
    )
    return _keyed("/v1/generate", body, idempotency_key)


def get_call(task_id: str) -> Call:
    return Call("GET", task_path(task_id), task_id=task_id)


def list_call(
    status: JobStatus | str | None, type: str | None, limit: int, cursor: str | None
) -> Call:
    params: dict[str, str | int] = _options(
        status=str(status) if status is not None else None, type=type, cursor=cursor
    )
    params["limit"] = limit
    return Call("GET", "/v1/tasks", params=params)


def cancel_call(task_id: str) -> Call:
    # Cancelling is idempotent on the server: a repeat answers the same job view.
    return Call("POST", task_path(task_id, "/cancel"), task_id=task_id)


def delete_call(task_id: str) -> Call:
    return Call("DELETE", task_path(task_id), task_id=task_id)


def dead_letters_call(limit: int, cursor: str | None) -> Call:
    params: dict[str, str | int] = _options(cursor=cursor)
    params["limit"] = limit
    return Call("GET", "/v1/dlq", params=params)


def replay_call(task_id: str) -> Call:
    # Not idempotent: a replay that landed but whose answer was lost would fail the repeat.
    path = f"/v1/dlq/{quote(task_id, safe='')}/replay"
    return Call("POST", path, idempotent=False, task_id=task_id)


def stats_call() -> Call:
    return Call("GET", "/v1/stats")


def usage_call() -> Call:
    return Call("GET", "/v1/usage")


def batch_path(batch_id: str, suffix: str = "") -> str:
    if not isinstance(batch_id, str) or not batch_id:
        raise InvalidInputError(f"batch_id must be a non-empty string, got {batch_id!r}")
    return f"/v1/batches/{quote(batch_id, safe='')}{suffix}"


def submit_batch_call(
    requests: Iterable[Mapping[str, Any]],
    *,
    model: str | None,
    priority: int | str | None,
    webhook_url: str | None,
    webhook_progress: bool,
    metadata: Mapping[str, Any] | None,
    idempotency_key: str | None,
) -> Call:
    items = []
    for index, request in enumerate(requests):
        if not isinstance(request, Mapping):
            raise InvalidInputError(
                f"requests[{index}] must be a mapping such as {{'custom_id': ..., 'prompt': ...}},"
                f" got {type(request).__name__}"
            )
        items.append(dict(request))
    body = _options(
        requests=items,
        model=model,
        priority=priority,
        webhook_url=webhook_url,
        webhook_progress=webhook_progress or None,
        metadata=dict(metadata) if metadata is not None else None,
    )
    return _keyed("/v1/batches", body, idempotency_key)


def get_batch_call(batch_id: str) -> Call:
    return Call("GET", batch_path(batch_id), task_id=batch_id)


def cancel_batch_call(batch_id: str) -> Call:
    return Call("POST", batch_path(batch_id, "/cancel"), task_id=batch_id)


def batch_results_call(batch_id: str, timeout: httpx.Timeout) -> Call:
    headers = {"Accept": "application/x-ndjson"}
    path = batch_path(batch_id, "/results")
    return Call("GET", path, headers=headers, task_id=batch_id, timeout=timeout, stream=True)


def results_cut(batch_id: str, exc: Exception) -> TransportError:
    """A results stream that broke part-way (its rows so far were given)."""
    return TransportError(f"the results of {batch_id} were cut off: {exc}; iterate again")


def parse_result_line(line: str, response: httpx.Response) -> dict[str, Any] | None:
    """One line of a batch's results (None for a blank one)."""
    if not line.strip():
        return None
    try:
        value = json.loads(line)
    except ValueError as exc:
        raise invalid_response(response, f"a result line is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise invalid_response(response, "a result line is not a JSON object")
    return value


def stream_headers(last_seq: int | None) -> dict[str, str]:
    headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
    if last_seq is not None:
        headers["Last-Event-ID"] = str(last_seq)
    return headers


def parse(model: type[M], response: httpx.Response, call: Call) -> M:
    """Raise the typed error of an error answer, else read the body as ``model``."""
    raise_for_error(response, task_id=call.task_id, key=call.key)
    try:
        return model.model_validate_json(response.content)
    except ValidationError as exc:
        raise invalid_response(response, exc) from exc


def parse_submission(response: httpx.Response, call: Call) -> Submission:
    raise_for_error(response, task_id=call.task_id, key=call.key)
    # 202: created now. 200 under a key the client made up: created by an earlier try of
    # this very call whose answer was lost (nobody else knows the key).
    created = response.status_code == 202 or call.key_generated
    try:
        data = response.json()
        if not isinstance(data, dict):
            raise TypeError("the answer is not a JSON object")
        return Submission.model_validate({**data, "created": created})
    except (ValidationError, ValueError, TypeError) as exc:
        raise invalid_response(response, exc) from exc


def parse_no_content(response: httpx.Response, call: Call) -> None:
    if call.method == "DELETE" and call.sent > 1 and response.status_code == 404:
        return  # an earlier try deleted it and its answer was lost: the delete happened
    raise_for_error(response, task_id=call.task_id, key=call.key)


def parse_event(message: ServerSentEvent, response: httpx.Response) -> Event:
    try:
        return Event.model_validate_json(message.data)
    except ValidationError as exc:
        raise invalid_response(response, f"event {message.id}: {exc}") from exc
