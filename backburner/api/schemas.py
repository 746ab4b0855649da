"""What crosses the HTTP API: request bodies and responses (pydantic, shown in /openapi.json)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

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

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

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
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "tool"]
    content: str


class GenerateCreate(BaseModel):
    """POST /v1/generate: exactly one of ``prompt`` or ``messages``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

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
    priority: PriorityValue | None = Priority
    webhook_url: str | None = WebhookUrl
    webhook_progress: bool = Field(
        default=False, description="Also POST task.progress to webhook_url as progress is reported."
    )
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_source(self) -> GenerateCreate:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        return self


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
    priority_classes: dict[str, int]


class WebhookList(BaseModel):
    data: list[WebhookDelivery]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page.")


class ErrorDetail(BaseModel):
    type: str
    message: str


class ErrorBody(BaseModel):
    """Every 4xx and 5xx answer has this shape."""

    error: ErrorDetail


class Health(BaseModel):
    status: Literal["ok", "ready"]
