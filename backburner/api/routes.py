"""The /v1 routes: submit, read, list, stream, cancel, delete, the DLQ, stats and health."""

from __future__ import annotations

import logging
import re
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse

from ..app import Backburner
from ..backends.base import fingerprint
from ..builtin import BATCH, DEFAULT_MAX_TOKENS, GENERATE, has_builtin_batch, is_builtin
from ..errors import BackendError, InvalidInputError, PermissionDeniedError, QuotaExceededError
from ..jsoncodec import depth
from ..keys import KeyRing, Principal
from ..models import MAX_EVENT_SEQ, Job, JobStatus, WebhookDelivery
from ..observability.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from ..providers.base import generation_args
from ..settings import Settings
from ..tenants import PRIORITY_MAX
from .auth import Caller, require_admin, scope
from .errors import documented
from .estimates import DurationEstimator, poll_after
from .events import EventHub, event_stream
from .schemas import (
    Accepted,
    GenerateCreate,
    Health,
    JobList,
    JobView,
    StatsView,
    TaskCreate,
    UsageView,
    WebhookList,
    WorkerView,
)

REPEAT: dict[int | str, dict[str, Any]] = {
    200: {"model": Accepted, "description": "an idempotent repeat: the same task"}
}
SSE: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "the event stream"},
    204: {"description": "the job has ended and the stream was resumed past its last event"},
}
MAX_SEQ = MAX_EVENT_SEQ
_EVENT_ID = re.compile(r"[0-9]{1,18}")
Cursor = Annotated[
    str | None,
    Query(pattern=r"^[0-9]{1,18}$", description="next_cursor from the previous page."),
]
WebhookCursor = Annotated[
    str | None,
    Query(
        pattern=r"^[0-9]{1,20}(\.[0-9]{1,20})?(e[+-]?[0-9]{1,2})?:msg_[0-9a-f]{32}$",
        description="next_cursor from the previous page.",
    ),
]
_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")  # printable ASCII, no spaces

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="Same key and same body: the same task (200). Same key, other body: 409.",
    ),
]

log = logging.getLogger("backburner.api")


def check_idempotency_key(request: Request, key: str | None) -> None:
    """InvalidInputError unless the request has no Idempotency-Key or one valid one (a proxy
    that adds a second must not decide silently which job a retry maps to)."""
    if key is None:
        return
    if len(request.headers.getlist("idempotency-key")) > 1:
        raise InvalidInputError("send one Idempotency-Key header, not several")
    if not _KEY.match(key):
        raise InvalidInputError("Idempotency-Key must be 1..255 printable ASCII characters")


LastEventId = Annotated[
    str | None,
    Header(alias="Last-Event-ID", description="Resume after this event id (SSE reconnects)."),
]


class Api:
    """The state every route needs; one per application."""

    def __init__(self, bb: Backburner, settings: Settings) -> None:
        self.bb = bb
        self.settings = settings
        self.estimator = DurationEstimator(bb)
        self.hub = EventHub(bb.backend)
        self.keys = KeyRing(settings)

    async def view_of(self, job: Job) -> JobView:
        typical, remaining = await self.estimator.for_job(job)
        return JobView.of(job, estimate=typical, remaining=remaining)

    def generation_caps(self, tenant: str) -> tuple[int, int]:
        """(longest prompt in characters, largest max_tokens) for the tenant's generations."""
        policy = self.bb.tenants.policy(tenant)
        return (
            min(self.settings.max_prompt_chars, policy.max_prompt_chars or 1 << 62),
            min(self.settings.max_tokens_limit, policy.max_tokens or 1 << 62),
        )

    def check_generation(self, payload: dict[str, Any]) -> None:
        """What a built-in ``generate`` job's run would refuse, refused at submission:
        ``/v1/tasks`` passes input through, and a model that is not configured, a prompt that is
        a list, max_tokens as text (past the caps), were stored to fail later. The run's own
        checks (``generation_args``, with its defaults), so no stricter than the run."""
        try:
            generation_args(
                payload.get("prompt"),
                payload.get("messages"),
                payload.get("max_tokens", DEFAULT_MAX_TOKENS),
                payload.get("temperature"),
                payload.get("stop") or (),  # (as the built-in task takes it)
            )
        except ValueError as exc:
            raise InvalidInputError(f"input: {exc}") from None
        model = payload.get("model")
        if model is not None and not isinstance(model, str):
            raise InvalidInputError("input: model must be a string")
        self.check_model(model)

    def check_model(self, model: str | None) -> str:
        """The configured model that ``model`` names (None: the default one)."""
        name = model or self.bb.models.default_model
        if name not in self.bb.models.routes:
            known = ", ".join(sorted(self.bb.models.routes))
            raise InvalidInputError(f"no model {name!r} is configured (known: {known})")
        return name

    def check_generation_caps(self, caller: Principal, payload: dict[str, Any]) -> None:
        """The caller's prompt-size and max_tokens caps for a ``generate`` job, however it was
        submitted (``/v1/generate`` or ``/v1/tasks``). Input of the wrong shape is left to the
        task's own check."""
        max_chars, max_tokens = self.generation_caps(caller.tenant)
        prompt, messages = payload.get("prompt"), payload.get("messages")
        chars = 0
        if isinstance(prompt, str):
            chars = len(prompt)
        elif isinstance(messages, list):
            chars = sum(len(str(m.get("content", ""))) for m in messages if isinstance(m, dict))
        if chars > max_chars:
            raise InvalidInputError(f"the prompt has {chars} characters; the limit is {max_chars}")
        # (Left out, the built-in task's own default applies: capped like any other.)
        requested = payload.get("max_tokens", DEFAULT_MAX_TOKENS)
        if isinstance(requested, int) and requested > max_tokens:
            raise InvalidInputError(f"max_tokens is limited to {max_tokens}")

    def check_json(self, *values: Any) -> None:
        for value in values:
            if depth(value) > self.settings.max_json_depth:
                raise InvalidInputError(
                    f"JSON nests deeper than {self.settings.max_json_depth} levels"
                )

    async def submit(
        self,
        request: Request,
        response: Response,
        caller: Principal,
        task: str,
        payload: dict[str, Any],
        body: dict[str, Any],
        key: str | None,
        model: str | None = None,
        **options: Any,
    ) -> Accepted:
        check_idempotency_key(request, key)
        if task == GENERATE:
            if is_builtin(self.bb, GENERATE):
                self.check_generation(payload)
            self.check_generation_caps(caller, payload)
        if task == BATCH and has_builtin_batch(self.bb):  # checked request by request there
            raise InvalidInputError("submit a batch with POST /v1/batches")
        try:
            job, created = await self.bb.submit(
                task,
                payload,
                idempotency_key=key,
                request_fingerprint=fingerprint(request.url.path, body),
                caller_traceparent=request.headers.get("traceparent"),
                tenant=caller.tenant,
                **options,
            )
        except QuotaExceededError as exc:
            # A place frees when one of the tenant's jobs ends: about a typical run from now.
            typical = await self.estimator.estimate(task, model)
            exc.retry_after = float(poll_after(typical if typical is not None else 5.0))
            raise
        typical = await self.estimator.estimate(task, model)
        poll_url = f"/v1/tasks/{job.task_id}"
        response.status_code = 202 if created else 200
        response.headers["Location"] = poll_url
        response.headers["Retry-After"] = str(poll_after(typical))
        return Accepted(
            task_id=job.task_id,
            status=job.status,
            estimated_time_sec=typical,
            poll_url=poll_url,
            stream_url=f"/v1/tasks/{job.task_id}/events",
        )


def build_router(api: Api) -> APIRouter:
    router = APIRouter()
    bb = api.bb
    settings = api.settings

    @router.post(
        "/v1/tasks",
        status_code=202,
        response_model=Accepted,
        responses=authed(400, 409, 413, 422, 429, 503, also=REPEAT),
        tags=["tasks"],
    )
    async def create_task(
        body: TaskCreate,
        request: Request,
        response: Response,
        caller: Caller,
        key: IdempotencyKey = None,
    ) -> Accepted:
        """Submit a job; answers at once with its id and where to poll or stream it. 429 with
        Retry-After when the tenant is at its quota of jobs in flight or its submission rate."""
        api.check_json(body.input, body.metadata)
        return await api.submit(
            request,
            response,
            caller,
            body.type,
            body.input,
            body.model_dump(mode="json"),
            key,
            model=body.input.get("model") if isinstance(body.input.get("model"), str) else None,
            priority=body.priority,
            webhook_url=body.webhook_url,
            webhook_progress=body.webhook_progress,
            metadata=body.metadata,
            max_attempts=body.max_attempts,
            timeout=body.timeout_s,
            ttl=body.ttl_s,
            delay=body.delay_s,
        )

    @router.post(
        "/v1/generate",
        status_code=202,
        response_model=Accepted,
        responses=authed(400, 409, 413, 422, 429, 503, also=REPEAT),
        tags=["tasks"],
    )
    async def generate(
        body: GenerateCreate,
        request: Request,
        response: Response,
        caller: Caller,
        key: IdempotencyKey = None,
    ) -> Accepted:
        """Generate text with a configured model (``model`` omitted: the default model)."""
        api.check_json(body.metadata)
        messages = [m.model_dump() for m in body.messages] if body.messages else None
        model = api.check_model(body.model)
        payload: dict[str, Any] = {"model": model, "max_tokens": body.max_tokens}
        if body.stop:
            payload["stop"] = body.stop
        if body.prompt is not None:
            payload["prompt"] = body.prompt
        else:
            payload["messages"] = messages
        if body.temperature is not None:
            payload["temperature"] = body.temperature
        return await api.submit(
            request,
            response,
            caller,
            GENERATE,
            payload,
            body.model_dump(mode="json"),
            key,
            model=model,
            priority=body.priority,
            webhook_url=body.webhook_url,
            webhook_progress=body.webhook_progress,
            metadata=body.metadata,
        )

    @router.get(
        "/v1/tasks/{task_id}",
        response_model=JobView,
        responses=authed(404, 503),
        tags=["tasks"],
        name="get_task",
    )
    async def get_task(task_id: str, caller: Caller) -> Response:
        """The job, with a poll hint: Retry-After and estimated_remaining_sec."""
        view = await api.view_of(await bb.get(task_id, tenant=scope(caller)))
        hint = None if view.status.is_terminal else str(poll_after(view.estimated_remaining_sec))
        # Already a valid model: serialise it once, skipping FastAPI's second validation.
        return Response(
            view.model_dump_json(),
            media_type="application/json",
            headers={"Retry-After": hint} if hint else None,
        )

    @router.get(
        "/v1/tasks", response_model=JobList, responses=authed(403, 422, 503), tags=["tasks"]
    )
    async def list_tasks(
        caller: Caller,
        status: JobStatus | None = None,
        type: Annotated[str | None, Query(max_length=200)] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
        cursor: Cursor = None,
        tenant: Annotated[str | None, Query(max_length=64, description="Admins only.")] = None,
    ) -> JobList:
        """Your jobs (an admin's: every tenant's, or ``tenant``'s), newest first; follow
        next_cursor for more."""
        page = await bb.list(
            status=status,
            type=type,
            limit=limit,
            cursor=cursor,
            tenant=_listing_scope(caller, tenant),
        )
        views = []
        for job in page.jobs:
            typical, remaining = await api.estimator.for_job(job)
            views.append(JobView.of(job, estimate=typical, remaining=remaining))
        return JobList(data=views, next_cursor=page.next_cursor)

    @router.get(
        "/v1/tasks/{task_id}/events",
        responses=authed(404, 422, 503, also=SSE),
        response_class=StreamingResponse,
        tags=["tasks"],
        name="stream_events",
    )
    async def stream_events(
        task_id: str,
        request: Request,
        caller: Caller,
        last_event_id: LastEventId = None,
        after: Annotated[
            int | None, Query(ge=0, le=MAX_SEQ, description="Resume after this seq.")
        ] = None,
    ) -> Response:
        """Server-sent events: the job's log from the start (or after Last-Event-ID / ?after=),
        then live until its terminal event; a keep-alive comment every 15 s. 204 for a
        finished job resumed past its last event: an EventSource stops reconnecting then."""
        job = await bb.get(task_id, tenant=scope(caller))  # 404 before the stream starts
        start = after or 0
        if len(request.headers.getlist("last-event-id")) > 1:
            raise InvalidInputError("send one Last-Event-ID header, not several")
        if last_event_id is not None and last_event_id.strip():  # empty: from the start
            if not _EVENT_ID.fullmatch(last_event_id.strip()):
                raise InvalidInputError("Last-Event-ID must be an event id (a number)")
            start = int(last_event_id)
        if start and job.is_terminal and not await bb.backend.events(task_id, after=start, limit=1):
            # (else it answers 200, ends at once, and the browser comes back every second)
            return Response(status_code=204)
        stream = event_stream(api.hub, task_id, start, keepalive_s=settings.sse_keepalive_s)
        return StreamingResponse(
            stream,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @router.post(
        "/v1/tasks/{task_id}/cancel",
        response_model=JobView,
        responses=authed(404, 503),
        tags=["tasks"],
    )
    async def cancel_task(task_id: str, caller: Caller) -> JobView:
        """Cancel now (idempotent): a queued job never runs, a running one stops within 1 s."""
        job = await bb.cancel(task_id, tenant=scope(caller))
        return await api.view_of(job)

    @router.get(
        "/v1/tasks/{task_id}/webhooks",
        response_model=list[WebhookDelivery],
        responses=authed(404, 503),
        tags=["webhooks"],
    )
    async def webhook_log(task_id: str, caller: Caller) -> list[WebhookDelivery]:
        """The job's webhook messages, each with every delivery attempt (time, status code,
        latency, error)."""
        return await bb.webhooks(task_id, tenant=scope(caller))

    @router.post(
        "/v1/tasks/{task_id}/webhooks/redeliver",
        status_code=202,
        response_model=WebhookDelivery,
        responses=authed(404, 409, 503),
        tags=["webhooks"],
    )
    async def redeliver(task_id: str, caller: Caller) -> WebhookDelivery:
        """Send the job's webhook again now (same webhook-id and body); 409 if it has none."""
        return await bb.redeliver_webhook(task_id, tenant=scope(caller))

    @router.get(
        "/v1/webhooks/failed",
        response_model=WebhookList,
        responses=authed(403, 422, 503),
        tags=["webhooks"],
    )
    async def failed_webhooks(
        caller: Caller,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
        cursor: WebhookCursor = None,
    ) -> WebhookList:
        """Webhook messages that failed for good (every attempt refused, or 410 Gone), most
        recent first; redeliver one with POST /v1/tasks/{id}/webhooks/redeliver. Admins only."""
        require_admin(caller)
        await bb.connect()
        page, next_cursor = await bb.backend.failed_webhooks(limit=limit, cursor=cursor)
        return WebhookList(data=page, next_cursor=next_cursor)

    @router.delete(
        "/v1/tasks/{task_id}",
        status_code=204,
        responses=authed(404, 409, 503),
        tags=["tasks"],
    )
    async def delete_task(task_id: str, caller: Caller) -> Response:
        """Delete a finished job and its events now (409 while it is queued or running)."""
        await bb.delete(task_id, tenant=scope(caller))
        return Response(status_code=204)

    @router.get("/v1/dlq", response_model=JobList, responses=authed(403, 422, 503), tags=["dlq"])
    async def dead_letters(
        caller: Caller,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
        cursor: Cursor = None,
        tenant: Annotated[str | None, Query(max_length=64, description="Admins only.")] = None,
    ) -> JobList:
        """Your failed jobs (an admin's: every tenant's), newest first, each with its attempt
        history."""
        page = await bb.dead_letters(
            limit=limit, cursor=cursor, tenant=_listing_scope(caller, tenant)
        )
        views = [JobView.of(job, estimate=None, remaining=0.0) for job in page.jobs]
        return JobList(data=views, next_cursor=page.next_cursor)

    @router.post(
        "/v1/dlq/{task_id}/replay",
        response_model=JobView,
        responses=authed(404, 409, 503),
        tags=["dlq"],
    )
    async def replay(task_id: str, caller: Caller) -> JobView:
        """Re-queue a failed job with a fresh attempt budget; its history is kept."""
        job = await bb.replay(task_id, tenant=scope(caller))
        return await api.view_of(job)

    @router.get("/v1/usage", response_model=UsageView, responses=authed(503), tags=["tenants"])
    async def usage(caller: Caller) -> UsageView:
        """Your tenant, its jobs in flight and its limits (null: no limit)."""
        policy = bb.tenants.policy(caller.tenant)
        return UsageView(
            tenant=caller.tenant,
            admin=caller.admin,
            in_flight=await bb.in_flight(caller.tenant),
            max_in_flight=policy.max_in_flight,
            submissions_per_minute=policy.submissions_per_minute,
            weight=policy.weight,
            max_prompt_chars=api.generation_caps(caller.tenant)[0],
            max_tokens=api.generation_caps(caller.tenant)[1],
            max_priority=PRIORITY_MAX if policy.max_priority is None else policy.max_priority,
            priority_classes=bb.priority_classes,
        )

    @router.get("/v1/stats", response_model=StatsView, responses=authed(403, 503), tags=["ops"])
    async def stats(caller: Caller) -> StatsView:
        """Queue depth by priority, jobs processing, DLQ size, workers seen in the last minute.
        Admins only."""
        require_admin(caller)
        current = await bb.backend.stats(now=bb.clock.now())
        return StatsView(
            counts=current.counts,
            queued_by_priority={str(p): n for p, n in current.queued_by_priority.items()},
            due=current.due,
            processing=current.counts.get(JobStatus.PROCESSING, 0),
            dead_letter=current.dead_letter,
            webhooks=await bb.backend.webhook_counts(),
            workers=[
                WorkerView(
                    worker_id=w.worker_id,
                    last_seen=w.last_seen,
                    running=w.running,
                    started_at=w.started_at,
                )
                for w in current.workers
            ],
        )

    @router.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        """Prometheus metrics (text exposition format); see docs/metrics.md. The backend
        down, this process's own counters are still served (``backburner_backend_up`` 0)."""
        try:
            await bb.connect()
            await bb.metrics.refresh(bb.backend, now=bb.clock.now())
        except BackendError as exc:
            bb.metrics.backend_up.set(0)
            log.warning("metrics: the backend's gauges are stale: %s", exc)
        return Response(bb.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    @router.get("/healthz", response_model=Health, tags=["ops"])
    async def healthz() -> Health:
        """The process is up."""
        return Health(status="ok")

    @router.get("/readyz", response_model=Health, responses=documented(503), tags=["ops"])
    async def readyz() -> Health:
        """The backend answers."""
        await bb.backend.stats(now=bb.clock.now(), worker_window_s=0)
        return Health(status="ready")

    return router


def authed(
    *statuses: int, also: dict[int | str, dict[str, Any]] | None = None
) -> dict[int | str, dict[str, Any]]:
    """``documented`` for a route behind the API key: also 400 (a malformed Authorization
    header) and 401 (no key, or an unknown one)."""
    return documented(400, 401, *statuses, also=also)


def _listing_scope(caller: Principal, tenant: str | None) -> str | None:
    """Whose jobs a listing shows: the caller's own; an admin's, every tenant's or one's."""
    if not caller.admin:
        if tenant is not None and tenant != caller.tenant:
            raise PermissionDeniedError("only an admin key may list another tenant's jobs")
        return caller.tenant
    return tenant
