"""What crosses the HTTP API: request bodies and responses (pydantic, shown in /openapi.json)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..models import (
    AttemptRecord,
    ErrorInfo,
    Job,
    JobStatus,
    Progress,
    Usage,
    WebhookDelivery,
)

Priority = Field(
    default=None,
    description="Higher runs first: -100..100, or a class name (interactive, default, batch;"
    " the priority_classes setting). Omitted: the task's own.",
)
PriorityValue = (
    Annotated[int, Field(ge=-100, le=100)]
    | Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
)
WebhookUrl = Field(default=None, max_length=2048, pattern=r"^https?://")


class TaskCreate(BaseModel):
    """POST /v1/tasks."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    type: str = Field(min_length=1, max_length=200, description="A registered task name.")
    input: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments.")
    priority: PriorityValue | None = Priority
    webhook_url: str | None = WebhookUrl
    webhook_progress: bool = Field(
        default=False, description="Also POST task.progress to webhook_url as progress is reported."
    )
    metadata: dict[str, Any] = Field(default_factory=dict)
    max_attempts: int | None = Field(default=None, ge=1, le=100)
    timeout_s: float | None = Field(default=None, gt=0, le=7 * 86400)
    ttl_s: float | None = Field(default=None, gt=0, le=366 * 86400)
    delay_s: float | None = Field(default=None, ge=0, le=366 * 86400)


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["system", "user", "assistant", "tool"]
    content: str


class Generation(BaseModel):
    """What one generation asks for: exactly one of ``prompt`` or ``messages``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    prompt: str | None = None
    messages: list[Message] | None = Field(default=None, min_length=1, max_length=1000)
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="A configured model's name; omitted: the service's default model.",
    )
    max_tokens: int = Field(default=256, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    stop: list[Annotated[str, Field(min_length=1, max_length=100)]] | None = Field(
        default=None, max_length=4, description="Up to 4 sequences that end the text."
    )

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        return self


class GenerateCreate(Generation):
    """POST /v1/generate: exactly one of ``prompt`` or ``messages``."""

    priority: PriorityValue | None = Priority
    webhook_url: str | None = WebhookUrl
    webhook_progress: bool = Field(
        default=False, description="Also POST task.progress to webhook_url as progress is reported."
    )
    metadata: dict[str, Any] = Field(default_factory=dict)


class Accepted(BaseModel):
    """The answer to a submission: where to poll and where to stream."""

    task_id: str
    status: JobStatus
    estimated_time_sec: float | None = Field(
        description="Typical run time of this task type (recent average); null if unknown."
    )
    poll_url: str
    stream_url: str


class JobView(BaseModel):
    """A job as the API shows it. Times are Unix seconds."""

    task_id: str
    type: str
    status: JobStatus
    priority: int
    tenant: str = "default"
    parent_id: str | None = Field(
        default=None, description="The pipeline (or batch) that spawned this job, if any."
    )
    input: dict[str, Any]
    created_at: float
    started_at: float | None
    finished_at: float | None
    attempts: int
    max_attempts: int
    progress: Progress
    result: Any = None
    error: ErrorInfo | None
    usage: Usage | None
    estimated_time_sec: float | None
    estimated_remaining_sec: float | None
    metadata: dict[str, Any]
    webhook_url: str | None
    webhook_progress: bool = False
    expires_at: float | None
    history: list[AttemptRecord]

    @classmethod
    def of(cls, job: Job, *, estimate: float | None, remaining: float | None) -> JobView:
        # A stored Job is already valid: no second validation pass.
        return cls.model_construct(
            task_id=job.task_id,
            type=job.type,
            status=job.status,
            priority=job.priority,
            tenant=job.tenant,
            parent_id=job.parent_id,
            input=job.input,
            created_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            attempts=job.attempts,
            max_attempts=job.max_attempts,
            progress=job.progress,
            result=job.result,
            error=job.error,
            usage=job.usage,
            estimated_time_sec=estimate,
            estimated_remaining_sec=remaining,
            metadata=job.metadata,
            webhook_url=job.webhook_url,
            webhook_progress=job.webhook_progress,
            expires_at=job.expires_at,
            history=job.history,
        )


class JobList(BaseModel):
    data: list[JobView]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page.")


class WorkerView(BaseModel):
    worker_id: str
    last_seen: float
    running: int
    started_at: float


class StatsView(BaseModel):
    counts: dict[JobStatus, int]
    queued_by_priority: dict[str, int]
    due: int = Field(
        description="Queued jobs whose time has come: not waiting for a delay, a retry's"
        " backoff or a parked pipeline's next look."
    )
    processing: int
    dead_letter: int
    workers: list[WorkerView]
    webhooks: dict[str, int] = Field(
        default_factory=dict, description="Webhook messages by status: pending, delivered, failed."
    )


class UsageView(BaseModel):
    """GET /v1/usage: the caller's tenant, its jobs in flight and its limits."""

    tenant: str
    admin: bool
    in_flight: int = Field(description="Your jobs queued or processing now.")
    max_in_flight: int | None = Field(description="Beyond it a submission gets 429. null: none.")
    submissions_per_minute: int | None = Field(description="null: no rate limit.")
    weight: float = Field(description="Your fair share of the workers within a priority.")
    max_prompt_chars: int
    max_tokens: int
    max_priority: int = Field(description="The highest priority you may ask for (100: any).")
    priority_classes: dict[str, int]


class WebhookList(BaseModel):
    data: list[WebhookDelivery]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page.")


class BatchRequest(Generation):
    """One request of a batch: a generation (as POST /v1/generate takes) and its custom_id."""

    custom_id: str = Field(
        min_length=1,
        max_length=256,
        description="Your name for this request, unique within the batch: its result line's key.",
    )


class BatchOptions(BaseModel):
    """What applies to a whole batch (POST /v1/batches, beside ``requests``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="The model of every request that names none; omitted: the default model.",
    )
    priority: PriorityValue | None = Field(
        default=None,
        description="The priority of the batch and of each of its requests: -100..100, or a"
        " class name (interactive, default, batch). Omitted: 0.",
    )
    webhook_url: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^https?://",
        description="POSTed the batch's outcome when it ends (task.completed, ...).",
    )
    webhook_progress: bool = Field(
        default=False, description="Also POST task.progress to webhook_url as requests end."
    )
    metadata: dict[str, Any] = Field(default_factory=dict)


class BatchCreate(BatchOptions):
    """POST /v1/batches: up to ``max_batch_requests`` generations run as one job."""

    requests: list[BatchRequest] = Field(
        min_length=1, description="The generations, each with a custom_id unique in the batch."
    )


class RequestCounts(BaseModel):
    """A batch's requests by status (``total`` is their sum)."""

    total: int
    queued: int
    processing: int
    completed: int
    failed: int
    cancelled: int


class BatchView(BaseModel):
    """A batch: its status, its requests by status and where its results are.

    ``status`` is ``queued`` until a worker starts it, ``processing`` while any request is
    unfinished, then ``completed`` once every request ended (some may have failed: see
    request_counts), or ``cancelled``, or ``failed`` (the batch itself could not go on)."""

    batch_id: str
    status: JobStatus
    tenant: str
    created_at: float
    started_at: float | None
    finished_at: float | None
    expires_at: float | None
    request_counts: RequestCounts
    metadata: dict[str, Any]
    error: ErrorInfo | None = Field(description="Why the batch failed, if it did.")
    webhook_url: str | None
    results_url: str = Field(description="GET it for the results as JSON Lines.")


class ErrorDetail(BaseModel):
    type: str
    message: str


class ErrorBody(BaseModel):
    """Every 4xx and 5xx answer has this shape."""

    error: ErrorDetail


class Health(BaseModel):
    status: Literal["ok", "ready"]
