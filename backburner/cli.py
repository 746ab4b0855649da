"""The ``backburner`` command line. Errors print one line and exit non-zero."""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import sys
from collections.abc import Coroutine
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from .app import Backburner
from .backends import backend_from_url
from .errors import BackburnerError, ConfigurationError
from .models import Job, JobStatus
from .settings import Settings

T = TypeVar("T")

cli = typer.Typer(
    help="backburner: long-running LLM and agent jobs behind a durable queue.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
dlq_cli = typer.Typer(help="The dead-letter queue: failed jobs.", no_args_is_help=True)
cli.add_typer(dlq_cli, name="dlq")

out = Console()
err = Console(stderr=True)

BackendOption = Annotated[
    str | None,
    typer.Option("--backend", "-b", help="Backend URL [env BACKBURNER_BACKEND_URL]."),
]


def _fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", highlight=False, markup=True)
    return typer.Exit(code)


def _run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(coro)
    except BackburnerError as exc:
        raise _fail(str(exc)) from None


def _settings(backend: str | None) -> Settings:
    try:
        return Settings.from_env(backend_url=backend)
    except BackburnerError as exc:
        raise _fail(str(exc), 2) from None


def load_app(path: str, backend: str | None = None) -> Backburner:
    """Import ``module:attribute`` (a Backburner) the way uvicorn imports an app."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(f"app must look like module:attribute, got {path!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r}: {exc}") from None
    app = getattr(module, attr, None)
    if not isinstance(app, Backburner):
        raise ConfigurationError(f"{path!r} is not a Backburner instance")
    if backend is not None:
        app.backend = backend_from_url(backend, max_queue_size=app.settings.max_queue_size)
    return app


def _bare_app(backend: str | None) -> Backburner:
    try:
        return Backburner(settings=_settings(backend))
    except BackburnerError as exc:
        raise _fail(str(exc), 2) from None


def _job_line(job: Job) -> str:
    return json.dumps(job.model_dump(mode="json"), indent=2)


# -- commands ---------------------------------------------------------------------------------


@cli.command()
def demo(
    backend: BackendOption = None,
    jobs: Annotated[int, typer.Option(help="How many simulated summaries to run.")] = 4,
) -> None:
    """Run a worker and a handful of demo jobs on the embedded backend, live."""
    from .demo import make_demo_app

    if not 1 <= jobs <= 1000:
        raise _fail("--jobs must be within 1..1000", 2)
    settings = _settings(backend)
    try:
        bb = make_demo_app(settings.backend_url, settings)
    except BackburnerError as exc:
        raise _fail(str(exc), 2) from None
    _run(_demo(bb, jobs))


async def _demo(bb: Backburner, count: int) -> None:
    async with bb:
        worker = bb.worker(concurrency=50)
        running = asyncio.create_task(worker.run())
        ids = [
            (
                await bb.enqueue(
                    "simulated_summary", {"text": f"document {i}", "tokens": 8 + 4 * i}
                )
            ).task_id
            for i in range(count)
        ]
        ids.append((await bb.enqueue("flaky_call", {"fail_times": 1})).task_id)
        ids.append((await bb.enqueue("broken_call", {})).task_id)
        out.print(f"backend: [bold]{bb.settings.backend_url}[/]  worker: {worker.worker_id}")
        with Live(console=out, refresh_per_second=10) as live:
            while True:
                current = [await bb.get(task_id) for task_id in ids]
                live.update(_jobs_table(current))
                if all(job.is_terminal for job in current):
                    break
                await asyncio.sleep(0.1)
        worker.shutdown()
        await running
        out.print()
        dead = await bb.dead_letters(limit=5)
        out.print(
            f"{len(dead.jobs)} job(s) in the dead-letter queue; replay one with "
            f"`backburner dlq replay {dead.jobs[0].task_id if dead.jobs else 'ID'}`"
        )


def _jobs_table(jobs: list[Job]) -> Table:
    table = Table("task_id", "type", "status", "attempts", "progress", "result / error")
    colours = {
        JobStatus.COMPLETED: "green",
        JobStatus.FAILED: "red",
        JobStatus.CANCELLED: "yellow",
        JobStatus.PROCESSING: "cyan",
        JobStatus.QUEUED: "white",
    }
    for job in jobs:
        outcome = ""
        if job.error is not None:
            outcome = f"{job.error.type}: {job.error.message}"
        elif job.result is not None:
            outcome = json.dumps(job.result)[:60]
        table.add_row(
            job.task_id,
            job.type,
            f"[{colours[job.status]}]{job.status.value}[/]",
            f"{job.attempts}/{job.max_attempts}",
            f"{job.progress.percent:.0f}% {job.progress.message or ''}",
            outcome,
        )
    return table


@cli.command()
def worker(
    app: Annotated[str, typer.Argument(help="Your Backburner as module:attribute.")],
    backend: BackendOption = None,
    concurrency: Annotated[int | None, typer.Option(help="Jobs run at once.")] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error")] = "info",
) -> None:
    """Run a worker process until SIGTERM/SIGINT (graceful; a second signal: at once)."""
    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        raise _fail(f"unknown log level {log_level!r}", 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if concurrency is not None and concurrency < 1:
        raise _fail("--concurrency must be >= 1", 2)
    try:
        bb = load_app(app, backend)
    except BackburnerError as exc:
        raise _fail(str(exc), 2) from None
    _run(_worker(bb, concurrency))


async def _worker(bb: Backburner, concurrency: int | None) -> None:
    async with bb:
        await bb.run_worker(concurrency=concurrency)


@cli.command()
def enqueue(
    app: Annotated[str, typer.Argument(help="Your Backburner as module:attribute.")],
    task: Annotated[str, typer.Argument(help="The task name.")],
    input: Annotated[str, typer.Option("--input", "-i", help="The input as JSON.")] = "{}",
    priority: Annotated[int | None, typer.Option(help="-100..100, higher first.")] = None,
    idempotency_key: Annotated[str | None, typer.Option()] = None,
    delay: Annotated[float | None, typer.Option(help="Seconds before it may run.")] = None,
    backend: BackendOption = None,
) -> None:
    """Enqueue a job directly on the backend and print it."""
    try:
        payload = json.loads(input)
    except json.JSONDecodeError as exc:
        raise _fail(f"--input is not valid JSON: {exc}", 2) from None
    try:
        bb = load_app(app, backend)
    except BackburnerError as exc:
        raise _fail(str(exc), 2) from None

    async def go() -> Job:
        async with bb:
            return await bb.enqueue(
                task, payload, priority=priority, idempotency_key=idempotency_key, delay=delay
            )

    out.print_json(_job_line(_run(go())))


@cli.command()
def status(task_id: str, backend: BackendOption = None) -> None:
    """Print a job."""
    bb = _bare_app(backend)

    async def go() -> Job:
        async with bb:
            return await bb.get(task_id)

    out.print_json(_job_line(_run(go())))


@cli.command()
def cancel(task_id: str, backend: BackendOption = None) -> None:
    """Cancel a job (idempotent) and print it."""
    bb = _bare_app(backend)

    async def go() -> Job:
        async with bb:
            return await bb.cancel(task_id)

    out.print_json(_job_line(_run(go())))


@cli.command()
def tasks(
    backend: BackendOption = None,
    status: Annotated[str | None, typer.Option(help="queued, processing, ...")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 20,
) -> None:
    """List jobs, newest first."""
    bb = _bare_app(backend)

    async def go() -> list[Job]:
        async with bb:
            return (await bb.list(status=status, limit=limit)).jobs

    out.print(_jobs_table(_run(go())))


@dlq_cli.command("ls")
def dlq_ls(
    backend: BackendOption = None, limit: Annotated[int, typer.Option(min=1, max=1000)] = 20
) -> None:
    """List failed jobs with their last error."""
    bb = _bare_app(backend)

    async def go() -> list[Job]:
        async with bb:
            return (await bb.dead_letters(limit=limit)).jobs

    out.print(_jobs_table(_run(go())))


@dlq_cli.command("replay")
def dlq_replay(
    task_id: str,
    backend: BackendOption = None,
    max_attempts: Annotated[int | None, typer.Option(min=1)] = None,
) -> None:
    """Re-queue a failed job with a fresh attempt budget (its history is kept)."""
    bb = _bare_app(backend)

    async def go() -> Job:
        async with bb:
            return await bb.replay(task_id, max_attempts=max_attempts)

    out.print_json(_job_line(_run(go())))


def main() -> None:
    cli()
