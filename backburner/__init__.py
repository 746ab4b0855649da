"""backburner: long-running LLM and agent jobs behind a durable queue."""

from .app import Backburner
from .backends import backend_from_url
from .clock import ManualClock, SystemClock
from .context import JobContext, current_job
from .errors import BackburnerError, PermanentError, Retry
from .hooks import Hooks
from .models import ErrorInfo, Event, Job, JobStatus, Progress, Usage
from .settings import Settings

__all__ = [
    "Backburner",
    "BackburnerError",
    "ErrorInfo",
    "Event",
    "Hooks",
    "Job",
    "JobContext",
    "JobStatus",
    "ManualClock",
    "PermanentError",
    "Progress",
    "Retry",
    "Settings",
    "SystemClock",
    "Usage",
    "backend_from_url",
    "current_job",
]

__version__ = "0.1.0"
