"""The /v1/batches routes: many generations in one request, run as one ``batch`` job.

A batch is a job of the built-in ``batch`` pipeline (builtin.py) whose id is the batch id; each
request becomes a ``generate`` child with its ``custom_id`` in the child's metadata. Every
request is checked here as POST /v1/generate checks one (model, the tenant's caps, prompt xor
messages) before anything is stored: one bad request refuses the batch, naming it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ValidationError

from ..backends.base import fingerprint
from ..builtin import BATCH, count_children, has_builtin_batch
from ..errors import BackburnerError, InvalidInputError, JobNotFoundError
from ..jsoncodec import encode
from ..keys import Principal
from ..models import Job, JobStatus
from .auth import Caller, scope
from .errors import error_response
from .estimates import poll_after
from .limits import RouteBodyTooLargeError, RouteLimit
from .routes import Api, IdempotencyKey, authed, check_idempotency_key
from .schemas import BatchCreate, BatchOptions, BatchRequest, BatchView, RequestCounts

BATCHES = "/v1/batches"
PAGE = 1000
JSONL = "application/x-ndjson"


def batch_body_limit(max_bytes: int) -> RouteLimit:
    """POST /v1/batches's own body limit (``max_batch_bytes``), for BodyLimitMiddleware."""
    return RouteLimit(
        max_bytes,
        "batch_too_large",
        "the batch is larger than {max_bytes} bytes (max_batch_bytes): split it into smaller"
        " batches",
    )


class BatchNotFoundError(JobNotFoundError):
    """No batch with that id (or it expired, or it is another tenant's, or not a batch)."""

    def __init__(self, batch_id: str) -> None:
        BackburnerError.__init__(self, f"no batch with id {batch_id!r}")
        self.task_id = batch_id


class BatchRefusedError(Exception):
    """A batch refused before anything is stored: answered as ``status`` and ``type``."""

    def __init__(self, status: int, type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.type = type


def is_json_type(content_type: str | None) -> bool:
    """Whether a Content-Type names JSON (``application/json``, ``application/*+json``, any
    parameters), as FastAPI requires of every other body."""
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def _inline(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON schema with its definitions inlined (no ``$ref``): the request body
    of a route that reads its body itself, for /openapi.json."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return resolve(definitions[ref.removeprefix("#/$defs/")])
            return {key: resolve(value) for key, value in node.items()}
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    resolved: dict[str, Any] = resolve(schema)
    return resolved


BATCH_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": _inline(BatchCreate)}},
    }
}
REPEAT: dict[int | str, dict[str, Any]] = {
    200: {"model": BatchView, "description": "an idempotent repeat: the same batch"}
}
RESULTS: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {JSONL: {"schema": {"type": "string"}}},
        "description": "one JSON object a line: custom_id, task_id, status, result, error, usage",
    }
}


def _problems(exc: ValidationError) -> str:
    found = []
    for item in exc.errors()[:3]:
        where = ".".join(str(part) for part in item.get("loc", ()))
        message = str(item.get("msg", "invalid")).removeprefix("Value error, ")
        found.append(f"{where}: {message}" if where else message)
    return "; ".join(found)


def _counts(values: dict[str, int]) -> RequestCounts:
    return RequestCounts(total=sum(values.values()), **values)


def poll_hint(total: int) -> int:
    """Seconds before a batch is worth polling again: longer for bigger batches (a look
    counts every request)."""
    return poll_after(1 + total // 2500)


class Batches:
    """The batch routes' logic, over the API's state."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.bb = api.bb
        self.settings = api.settings
        self._one_body = asyncio.Semaphore(1)
        """One batch body read, checked and stored at a time: each takes about 8 times its
        size at its peak (62.5 MB took the API to 552 MiB, and two at once to 921 MiB), and
        holds the event loop while it is parsed, so two at once are no faster."""

    # -- submitting ----------------------------------------------------------------------

    def parse(self, raw: bytes) -> dict[str, Any]:
        if not raw.strip():
            raise BatchRefusedError(
                400, "invalid_json", 'the body is empty: send {"requests": [...]}'
            )
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise BatchRefusedError(
                400, "invalid_json", f"the body is not valid JSON: {exc}"
            ) from None
        if not isinstance(body, dict):
            raise BatchRefusedError(422, "invalid_request", "the body must be a JSON object")
        requests = body.get("requests")
        if not isinstance(requests, list):
            what = "is required" if requests is None else "must be a list of requests"
            raise BatchRefusedError(422, "invalid_request", f"requests {what}")
        limit = self.settings.max_batch_requests
        if len(requests) > limit:
            raise BatchRefusedError(
                413,
                "batch_too_large",
                f"the batch has {len(requests)} requests; a batch holds at most {limit}"
                " (max_batch_requests): split it into smaller batches",
            )
        if not requests:
            raise BatchRefusedError(
                422, "invalid_request", "requests: a batch needs at least one request"
            )
        return body

    def options(self, body: dict[str, Any]) -> BatchOptions:
        try:
            options = BatchOptions.model_validate(
                {k: v for k, v in body.items() if k != "requests"}
            )
        except ValidationError as exc:
            raise BatchRefusedError(422, "invalid_request", _problems(exc)) from None
        self.api.check_json(body)
        return options

    def checked(
        self, caller: Principal, requests: list[Any], default_model: str | None
    ) -> list[dict[str, Any]]:
        """Each request as its ``generate`` child's input (with its custom_id); raises
        BatchRefusedError or InvalidInputError naming the first bad one."""
        models = self.bb.models
        known = models.routes
        seen: dict[str, int] = {}
        payloads: list[dict[str, Any]] = []
        for index, item in enumerate(requests):
            label = f"requests[{index}]"
            if not isinstance(item, dict):
                raise BatchRefusedError(422, "invalid_request", f"{label}: must be a JSON object")
            custom_id = item.get("custom_id")
            if isinstance(custom_id, str):
                label += f" (custom_id {custom_id!r})"
            try:
                request = BatchRequest.model_validate(item)
            except ValidationError as exc:
                raise BatchRefusedError(
                    422, "invalid_request", f"{label}: {_problems(exc)}"
                ) from None
            first = seen.setdefault(request.custom_id, index)
            if first != index:
                raise BatchRefusedError(
                    422,
                    "invalid_request",
                    f"{label}: custom_id {request.custom_id!r} is also requests[{first}]'s;"
                    " each request of a batch needs its own",
                )
            model = request.model or default_model or models.default_model
            if model not in known:
                names = ", ".join(sorted(known))
                raise InvalidInputError(
                    f"{label}: no model {model!r} is configured (known: {names})"
                )
            payload: dict[str, Any] = {
                "custom_id": request.custom_id,
                "model": model,
                "max_tokens": request.max_tokens,
            }
            if request.prompt is not None:
                payload["prompt"] = request.prompt
            else:
                payload["messages"] = [m.model_dump() for m in request.messages or ()]
            if request.temperature is not None:
                payload["temperature"] = request.temperature
            if request.stop:
                payload["stop"] = request.stop
            try:
                self.api.check_generation_caps(caller, payload)
            except InvalidInputError as exc:
                raise InvalidInputError(f"{label}: {exc}") from None
            payloads.append(payload)
        return payloads

    async def submit(
        self, request: Request, caller: Principal, key: str | None
    ) -> tuple[Job, bool]:
        check_idempotency_key(request, key)
        if not is_json_type(request.headers.get("content-type")):
            # A browser sends text/plain, a form or a typeless blob to any site without asking
            # (no CORS preflight): any page a user opened could have spent their models.
            raise BatchRefusedError(
                422,
                "invalid_request",
                "the body must be a JSON object (Content-Type: application/json)",
            )
        async with self._one_body:  # (the others' bodies wait in their sockets meanwhile)
            return await self._submit(request, caller, key)

    async def _submit(
        self, request: Request, caller: Principal, key: str | None
    ) -> tuple[Job, bool]:
        try:
            raw = await request.body()
        except RouteBodyTooLargeError as exc:
            raise BatchRefusedError(413, exc.limit.type, exc.limit.describe()) from None
        body = self.parse(raw)
        options = self.options(body)
        payloads = self.checked(caller, body["requests"], options.model)
        return await self.bb.submit(
            BATCH,
            {"requests": payloads},
            idempotency_key=key,
            request_fingerprint=fingerprint(request.url.path, body),
            caller_traceparent=request.headers.get("traceparent"),
            tenant=caller.tenant,
            priority=options.priority,
            metadata=options.metadata,
            webhook_url=options.webhook_url,
            webhook_progress=options.webhook_progress,
        )

    # -- reading -------------------------------------------------------------------------

    async def load(self, batch_id: str, caller: Principal) -> Job:
        """The batch's job; BatchNotFoundError (404) exactly alike for a missing id, another
        tenant's batch, and a job that is not a batch."""
        try:
            job = await self.bb.get(batch_id, tenant=scope(caller))
        except JobNotFoundError:
            raise BatchNotFoundError(batch_id) from None
        if job.type != BATCH:
            raise BatchNotFoundError(batch_id)
        return job

    async def counts(self, job: Job, *, fresh: bool = False) -> RequestCounts:
        """The batch's requests by status: stored in its result once it completed; else its
        children counted now, the requests not queued yet counting as queued (or, once the
        batch ended otherwise, as what it ended as)."""
        total = len(job.input.get("requests") or ())
        stored = job.result.get("request_counts") if isinstance(job.result, dict) else None
        if job.status == JobStatus.COMPLETED and isinstance(stored, dict):
            return _counts({s.value: int(stored.get(s.value, 0)) for s in JobStatus})
        values = {s.value: 0 for s in JobStatus}
        if not fresh:
            values = await count_children(self.bb, job.task_id)
        unborn = max(0, total - sum(values.values()))
        if job.status == JobStatus.CANCELLED:
            values["cancelled"] += unborn
        elif job.status == JobStatus.FAILED:
            values["failed"] += unborn
        else:
            values["queued"] += unborn
        return _counts(values)

    async def view(self, job: Job, *, fresh: bool = False) -> BatchView:
        counts = await self.counts(job, fresh=fresh)
        status = job.status
        if status == JobStatus.QUEUED and (
            job.started_at is not None or counts.queued < counts.total
        ):
            status = JobStatus.PROCESSING  # parked while its requests run, or some have run
        return BatchView(
            batch_id=job.task_id,
            status=status,
            tenant=job.tenant,
            created_at=job.created_at,
            # A pipeline runs again each time it wakes; the batch started at its first run.
            started_at=job.history[0].started_at if job.history else job.started_at,
            finished_at=job.finished_at,
            expires_at=job.expires_at,
            request_counts=counts,
            metadata=job.metadata,
            error=job.error,
            webhook_url=job.webhook_url,
            results_url=f"{BATCHES}/{job.task_id}/results",
        )

    async def results(self, job: Job) -> AsyncIterator[bytes]:
        """JSON Lines, one per finished request (newest first); once the batch has ended, also
        one for each request it never started."""
        spawned: set[str] = set()
        cursor: str | None = None
        while True:
            page = await self.bb.list(parent_id=job.task_id, limit=PAGE, cursor=cursor)
            lines = []
            for child in page.jobs:
                custom_id = child.metadata.get("custom_id")
                if isinstance(custom_id, str):
                    spawned.add(custom_id)
                if child.is_terminal:
                    lines.append(_line(custom_id, child))
            if lines:
                yield "".join(lines).encode()
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        if not job.is_terminal:
            return
        reason = job.error
        lines = []
        for request in job.input.get("requests") or ():
            custom_id = request.get("custom_id") if isinstance(request, dict) else None
            if isinstance(custom_id, str) and custom_id not in spawned:
                if job.status == JobStatus.CANCELLED or reason is None:
                    error = {
                        "type": "cancelled",
                        "message": "the batch ended before this request was queued",
                        "retryable": False,
                    }
                else:
                    error = reason.model_dump()
                status = "cancelled" if job.status == JobStatus.CANCELLED else "failed"
                row = {"custom_id": custom_id, "task_id": None, "status": status}
                lines.append(encode({**row, "result": None, "error": error, "usage": None}) + "\n")
        if lines:
            yield "".join(lines).encode()


def _line(custom_id: Any, child: Job) -> str:
    error = child.error.model_dump() if child.error is not None else None
    if child.status == JobStatus.CANCELLED and error is None:
        error = {"type": "cancelled", "message": "the request was cancelled", "retryable": False}
    return (
        encode(
            {
                "custom_id": custom_id,
                "task_id": child.task_id,
                "status": child.status.value,
                "result": child.result if child.status == JobStatus.COMPLETED else None,
                "error": None if child.status == JobStatus.COMPLETED else error,
                "usage": child.usage.model_dump() if child.usage is not None else None,
            }
        )
        + "\n"
    )


def _json(view: BatchView, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        view.model_dump_json(), status_code=status, media_type="application/json", headers=headers
    )


def build_batch_router(api: Api) -> APIRouter:
    """The /v1/batches routes (create_app includes them beside build_router's); none when the
    application has a ``batch`` task of its own."""
    router = APIRouter(tags=["batches"])
    if not has_builtin_batch(api.bb):
        return router
    batches = Batches(api)

    @router.post(
        BATCHES,
        status_code=202,
        response_model=BatchView,
        responses=authed(400, 409, 413, 422, 429, 503, also=REPEAT),
        openapi_extra=BATCH_BODY,
    )
    async def create_batch(
        request: Request, caller: Caller, key: IdempotencyKey = None
    ) -> Response:
        """Submit up to max_batch_requests (10,000) generations as one batch: 202 at once with
        its id. Each request is checked as POST /v1/generate checks one; a bad one refuses the
        whole batch (422, naming its custom_id). The batch is one job of the tenant's quota."""
        try:
            job, created = await batches.submit(request, caller, key)
        except BatchRefusedError as exc:
            return error_response(exc.status, exc.type, str(exc))
        view = await batches.view(job, fresh=created)
        location = f"{BATCHES}/{job.task_id}"
        hint = str(poll_hint(view.request_counts.total))
        headers = {"Location": location, "Retry-After": hint}
        return _json(view, 202 if created else 200, headers)

    @router.get(
        BATCHES + "/{batch_id}",
        response_model=BatchView,
        responses=authed(404, 503),
        name="get_batch",
    )
    async def get_batch(batch_id: str, caller: Caller) -> Response:
        """The batch: its status and request_counts {queued, processing, completed, failed,
        cancelled}; a Retry-After header while it runs."""
        view = await batches.view(await batches.load(batch_id, caller))
        running = not view.status.is_terminal
        hint = {"Retry-After": str(poll_hint(view.request_counts.total))} if running else None
        return _json(view, headers=hint)

    @router.get(
        BATCHES + "/{batch_id}/results",
        responses=authed(404, 503, also=RESULTS),
        response_class=StreamingResponse,
    )
    async def batch_results(batch_id: str, caller: Caller) -> StreamingResponse:
        """The results as JSON Lines, streamed: one line per finished request, in no set order
        (key them by custom_id): {custom_id, task_id, status, result, error, usage}. While the
        batch runs, the requests finished so far; once it ended, every request."""
        job = await batches.load(batch_id, caller)  # 404 before the stream starts
        return StreamingResponse(
            batches.results(job),
            media_type=JSONL,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @router.post(
        BATCHES + "/{batch_id}/cancel",
        response_model=BatchView,
        responses=authed(404, 503),
    )
    async def cancel_batch(batch_id: str, caller: Caller) -> BatchView:
        """Cancel the batch (idempotent): requests not started never run, running ones stop
        within a second; finished ones keep their results."""
        job = await batches.load(batch_id, caller)
        return await batches.view(await api.bb.cancel(job.task_id))

    return router
