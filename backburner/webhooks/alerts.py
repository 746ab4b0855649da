"""An operator's alert for every job that lands in the dead-letter queue (``admin_webhook_url``).

Signed like job webhooks and retried on the same schedule, but kept in the worker's memory:
an alert is lost if its worker process dies before it is delivered. The dead-letter queue
itself (``GET /v1/dlq``, the ``backburner_dead_letter_jobs`` gauge and its alert rule) is the
durable record; this is the nudge.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from typing import TYPE_CHECKING

from ..aio import wait_all_or
from ..backends.outbox import new_msg_id
from ..hooks import Hooks
from ..models import Job
from .receivers import USER_AGENT
from .signing import sign

if TYPE_CHECKING:
    from ..app import Backburner

log = logging.getLogger("backburner.webhooks")

EVENT = "task.dead_lettered"


def alert_body(job: Job) -> str:
    error = job.error.model_dump() if job.error is not None else None
    return json.dumps(
        {
            "type": EVENT,
            "task_id": job.task_id,
            "task_type": job.type,
            "status": job.status.value,
            "error": error,
            "attempts": job.attempts,
            "metadata": job.metadata,
            "created_at": job.created_at,
            "finished_at": job.finished_at,
        },
        separators=(",", ":"),
    )


class DeadLetterAlerts(Hooks):
    """Posts ``task.dead_lettered`` to ``admin_webhook_url`` for each job that fails for good."""

    def __init__(self, app: Backburner, url: str) -> None:
        import httpx  # (only where alerts are configured: a worker without saves 4 MB)

        settings = app.settings
        self.url = url
        self.secrets = (settings.webhook_secret or "").split()
        self.schedule = settings.retry_schedule()
        self.timeout_s = settings.webhook_timeout_s
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.webhook_timeout_s),
            follow_redirects=False,
            headers={"User-Agent": USER_AGENT, "Content-Type": "application/json"},
        )
        self._sending: set[asyncio.Task[None]] = set()
        self._closing = False

    async def on_fail(self, job: Job) -> None:
        if self._closing:  # (a hook chain's emit begun before the worker removed this hook)
            log.warning("dead-letter alert for job %s not sent: the worker stopped", job.task_id)
            return
        task = asyncio.create_task(self._send(job), name=job.task_id)
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, job: Job) -> None:
        if not self.secrets:  # (unsigned, it could be forged: as for every webhook)
            log.warning(
                "dead-letter alert for job %s not sent: no webhook secret is configured"
                " (BACKBURNER_WEBHOOK_SECRET)",
                job.task_id,
                extra={"task_id": job.task_id, "event": "alert_failed"},
            )
            return
        msg_id, body = new_msg_id(), alert_body(job).encode()
        for attempt, delay in enumerate(self.schedule, 1):
            await asyncio.sleep(delay * random.uniform(0.9, 1.1))
            try:
                headers = sign(self.secrets, msg_id, int(time.time()), body)
                request = self._client.build_request(
                    "POST", self.url, content=body, headers=headers
                )
                async with asyncio.timeout(self.timeout_s):  # the whole attempt, not per read
                    response = await self._client.send(request, stream=True)
                    await response.aclose()  # (only its status matters: no body is read)
                if 200 <= response.status_code < 300 or response.status_code == 410:
                    return
                problem = f"HTTP {response.status_code}"
            except TimeoutError:
                problem = f"timed out after {self.timeout_s:g} s"
            except Exception as exc:  # retried on the schedule like any webhook
                problem = f"{type(exc).__name__}: {exc}"
            log.warning(
                "dead-letter alert for job %s, attempt %d: %s",
                job.task_id,
                attempt,
                problem,
                extra={"task_id": job.task_id, "msg_id": msg_id, "event": "alert_failed"},
            )

    async def aclose(self, wait_s: float, hurry: asyncio.Event | None = None) -> None:
        """Give alerts in flight ``wait_s`` to finish (less once ``hurry`` is set), then drop
        them; none is sent from the moment this is called."""
        self._closing = True
        try:
            await wait_all_or(set(self._sending), hurry, wait_s)
        finally:  # (cancelled while it waits: what follows runs all the same)
            for task in self._sending:
                log.warning(
                    "dead-letter alert for job %s dropped: the worker stopped", task.get_name()
                )
                task.cancel()
            await asyncio.gather(*self._sending, return_exceptions=True)
            await self._client.aclose()
